"""Runs cstream on a Ray cluster of 3 nodes on this machine and reports what happened, as JSON.

Not a test module: ``tests/test_multinode.py`` runs it in a process of its own (the rest of the
suite shares one embedded Ray per session, and a cluster needs its own). Usage::

    python tests/multinode_cluster.py OUT.json

The cluster (``ray.cluster_utils.Cluster``) is a head and 2 worker nodes on 127.0.0.1, 2 CPUs
each, every node its own raylet, object store and worker processes; this process starts it,
kills nodes of it, and shuts it down. The runs (``--runs``, default the first two), the first
two with 6 input workers over the 3 nodes:

1. ``input_node``: 150 steps over ShardedSampler batches of sample ids; at step 40 a worker
   node holding 2 input workers (not the wafer driver's) loses all its processes (SIGKILL of
   its input workers, then of the node: raylet and the rest).
2. ``driver_node``: the head's CPUs are held so that the wafer driver starts on a worker
   node; at step 25 (checkpoints every 10 steps) that node loses all its processes.
"""

from __future__ import annotations

import json
import os
import signal
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray server on 127.0.0.1

import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import cstream as cstorch  # noqa: E402
from executor.driver import DriverError  # noqa: E402

NODE_ARGS = dict(num_cpus=2, object_store_memory=96 * 1024 * 1024, node_ip_address="127.0.0.1")
WORKERS = 6
BATCH_SLEEP_S = 0.01  # I/O-like input: each batch is read in 10 ms


def ids_input_fn(n_batches, batch=2, sleep_s=BATCH_SLEEP_S):
    """Global batches of sample ids (ShardedSampler: the wafer must see 0, 1, 2, ... in order);
    reading a sample sleeps, as a read from storage does."""
    import time as _time

    from torch.utils.data import BatchSampler, Dataset, SequentialSampler

    class Slow(Dataset):
        def __len__(self):
            return n_batches * batch

        def __getitem__(self, i):
            _time.sleep(sleep_s / batch)
            return torch.tensor([float(i)])

    batches = BatchSampler(SequentialSampler(range(n_batches * batch)), batch, drop_last=True)
    return torch.utils.data.DataLoader(
        Slow(), batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def _worker_places():
    """``{name: where()}`` of the run's input workers, asked of the actors themselves."""
    out = {}
    for w in range(WORKERS):
        name = f"cstream-csx0-w{w}"
        out[name] = ray.get(ray.get_actor(name).where.remote(), timeout=30)
    return out


def _kill_node(cluster, node_id, places):
    """SIGKILL every process of the node: the actors of ``places`` on it (name -> where()),
    then its raylet and the rest (``remove_node(allow_graceful=False)``)."""
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    for where in places.values():
        if where["node_id"] == node_id:
            os.kill(where["pid"], signal.SIGKILL)
    cluster.remove_node(node, allow_graceful=False)


def _model(backend):
    model = torch.nn.Linear(1, 1)
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def step(batch):
        return compiled(batch).sum(), batch

    return model, step


def input_node_run(cluster) -> dict:
    backend = cstorch.backend("CSX", artifact_dir="input_node_run")
    _, step = _model(backend)
    seen, out = [], {}

    @cstorch.step_closure
    def record(x):
        seen.extend(x.flatten().tolist())

    executor = cstorch.utils.data.DataExecutor(
        # one epoch longer than the run: the numbers a worker owed are in the epoch the
        # others are in (at an epoch's end they go to the worker's new process instead)
        cstorch.utils.data.DataLoader(ids_input_fn, 1000), num_steps=150,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=WORKERS))
    for i, batch in enumerate(executor):
        _, x = step(batch)
        record(x)
        if i == 0:
            out["driver_node"] = backend.driver().where["node_id"]
            out["places_before"] = _worker_places()
        if i == 39:
            by_node = {}
            for where in out["places_before"].values():
                by_node.setdefault(where["node_id"], []).append(where)
            victim = next(n.node_id for n in cluster.worker_nodes
                          if n.node_id != out["driver_node"] and len(by_node.get(n.node_id, [])) == 2)
            out["killed_node"] = victim
            out["killed_at_step"] = i + 1
            out["killed_unix"] = time.time()
            _kill_node(cluster, victim, out["places_before"])
    backend.shutdown()
    profile = json.loads((executor.run_dir / "profile.json").read_text())
    out["max_step_input_wait_s"] = max(r.get("input_wait_s", 0.0) for r in profile["steps"])
    out.update(seen=seen, report=executor.report, workers=profile["summary"]["workers"],
               summary=cstorch_summary(executor))
    return out


AUTOSCALED_STEPS, AUTOSCALED_KILL_STEP = 900, 600


def _live_worker_places() -> dict:
    """``{name: where()}`` of every live input worker of CS-X 0 (added ones included)."""
    from ray.util import list_named_actors

    out = {}
    for name in list_named_actors():
        if name.startswith("cstream-csx0-w"):
            try:
                out[name] = ray.get(ray.get_actor(name).where.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayError):
                pass  # retired or dead between the listing and the question
    return out


def autoscaled_run(cluster) -> dict:
    backend = cstorch.backend("CSX", artifact_dir="autoscaled_run")
    _, step = _model(backend)
    seen, out = [], {}

    @cstorch.step_closure
    def record(x):
        seen.extend(x.flatten().tolist())

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(ids_input_fn, 1000, batch=2, sleep_s=0.06),
        num_steps=AUTOSCALED_STEPS,
        cs_config=cstorch.utils.CSConfig(
            num_workers_per_csx="auto", wafer_seconds_per_step=0.024,
            autoscale=cstorch.utils.Autoscale(min_workers_per_csx=1, max_workers_per_csx=6,
                                              window_steps=20, cooldown_steps=20)))
    for i, batch in enumerate(executor):
        _, x = step(batch)
        record(x)
        if i == 0:
            out["driver_node"] = backend.driver().where["node_id"]
        if i == AUTOSCALED_KILL_STEP - 1:
            places = _live_worker_places()
            out["places_before_kill"] = places
            by_node: dict = {}
            for where in places.values():
                by_node[where["node_id"]] = by_node.get(where["node_id"], 0) + 1
            victim = max((n.node_id for n in cluster.worker_nodes
                          if n.node_id != out["driver_node"]),
                         key=lambda n: by_node.get(n, 0))
            out["killed_node"] = victim
            out["killed_at_step"] = i + 1
            _kill_node(cluster, victim, places)
    backend.shutdown()
    profile = json.loads((executor.run_dir / "profile.json").read_text())
    out.update(seen=seen, report=executor.report, counts=[r["num_workers"][0]
                                                          for r in profile["steps"]],
               workers=profile["summary"]["workers"], summary=cstorch_summary(executor))
    return out


def cstorch_summary(executor) -> str:
    from executor.report_text import format_summary

    return format_summary(executor.report)


def driver_node_run(cluster) -> dict:
    head = ray.get_runtime_context().get_node_id()
    # the head keeps 0.5 CPU: room for input workers (0.01 CPU), none for the driver (1 CPU)
    holder = ray.remote(num_cpus=1.5)(_Holder).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    ray.get(holder.ping.remote())
    backend = cstorch.backend("CSX", artifact_dir="driver_node_run")
    model, step = _model(backend)
    out = {"head": head}
    seen = []

    @cstorch.step_closure
    def record(x):
        seen.extend(x.flatten().tolist())

    @cstorch.checkpoint_closure
    def save(i):
        cstorch.save({"model": model.state_dict()}, f"ckpt_{i + 1}.h5")

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(ids_input_fn, 400), num_steps=400, checkpoint_steps=10,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=WORKERS))
    try:
        for i, batch in enumerate(executor):
            _, x = step(batch)
            record(x)
            save(i)
            if i == 0:
                out["driver_node"] = backend.driver().where["node_id"]
                out["places_before"] = _worker_places()
            if i == 24:
                out["killed_at_step"] = i + 1
                t_kill = time.perf_counter()
                _kill_node(cluster, out["driver_node"],
                           {**out["places_before"], "driver": backend.driver().where})
    except DriverError as e:
        out["error_after_kill_s"] = time.perf_counter() - t_kill
        out["error"] = {"type": type(e).__name__, "message": str(e),
                        "context": type(e.__context__).__name__ if e.__context__ else None,
                        "cause": type(e.__cause__).__name__ if e.__cause__ else None}
    else:
        out["error"] = None
    survivors = [w for w in out["places_before"].values()
                 if w["node_id"] != out["driver_node"]]
    out["survivors"] = len(survivors)
    out["survivors_alive_at_error"] = sum(_alive(w["pid"]) for w in survivors)
    deadline = time.perf_counter() + 60
    while any(_alive(w["pid"]) for w in survivors) and time.perf_counter() < deadline:
        time.sleep(0.1)
    out["survivors_gone_after_s"] = None if any(_alive(w["pid"]) for w in survivors) \
        else time.perf_counter() - t_kill
    out["steps_seen"] = len(seen) // 2  # 2 samples a step
    backend.shutdown()
    ray.kill(holder)
    return out


class _Holder:
    def ping(self):
        return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(path: str, runs: list) -> None:
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args=NODE_ARGS)
    try:
        for _ in range(2):
            cluster.add_node(**NODE_ARGS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        results = {"cluster_start_s": time.perf_counter() - t0}
        for name in runs:
            if len(cluster.worker_nodes) < 2:
                cluster.add_node(**NODE_ARGS)  # 3 nodes again
                cluster.wait_for_nodes()
            results[name] = RUNS[name](cluster)
        results["total_s"] = time.perf_counter() - t0
    finally:
        ray.shutdown()
        cluster.shutdown()
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)


RUNS = {"input_node": input_node_run, "driver_node": driver_node_run,
        "autoscaled": autoscaled_run}

if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--runs", default="input_node,driver_node",
                   help=f"comma-separated, of {', '.join(RUNS)}")
    args = p.parse_args()
    main(args.out, args.runs.split(","))
