"""Multi-node input: I/O-like input at 4, 8 and 16 workers over a Ray cluster of 3 nodes on
this machine, and what the dynamic-assignment coordinator costs per batch it assigns.

The cluster is ``ray.cluster_utils.Cluster``: a head and 2 worker nodes on 127.0.0.1, 2 CPUs
each, every node its own raylet, object store and worker processes. The run is the real path:
a DataExecutor on the CSX backend with no model (the wafer takes batches as fast as they
come), one CS-X, ``num_workers_per_csx`` input workers spread round-robin over the 3 nodes,
each reading global batches of one sample from a ``ShardedSampler`` whose read sleeps
``--sleep-ms`` (I/O-like: the workers wait, the cores stay free). Measured per run:

* batches/s reaching the wafer (steady state, the run report's ``samples_per_s``), against
  the ideal ``N / batch cost`` with each worker's median batch cost as it measured it;
* the coordinator's cost per assigned batch: the CPU time of its thread (issuing numbers,
  scanning the workers, waiting on and taking in their replies) and, within it, the CPU time
  spent issuing numbers (choosing the worker, sending them), each divided by the numbers it
  assigned.

Variants are interleaved round by round (4, 8, 16, then 16, 8, 4, ...) and medians reported.
Writes ``benchmarks/results/multinode.json`` and ``multinode.png``.

    python -m benchmarks.multinode [--rounds 2] [--workers 4,8,16] [--batches-per-worker 100]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray server on 127.0.0.1

import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

import cstream as cstorch  # noqa: E402
from benchmarks.bench_data import save_results  # noqa: E402

NODE_ARGS = dict(num_cpus=2, object_store_memory=128 * 1024 * 1024,
                 node_ip_address="127.0.0.1")
NODES = 3


def io_input_fn(num_batches: int, sleep_s: float):
    """Global batches of one sample id; reading a sample sleeps ``sleep_s`` (I/O-like)."""
    import time as _time

    from torch.utils.data import BatchSampler, Dataset, SequentialSampler

    class Slow(Dataset):
        def __len__(self):
            return num_batches

        def __getitem__(self, i):
            _time.sleep(sleep_s)
            return torch.tensor([float(i)])

    batches = BatchSampler(SequentialSampler(range(num_batches)), 1, drop_last=True)
    return torch.utils.data.DataLoader(
        Slow(), batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def run(workers: int, steps: int, sleep_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        backend = cstorch.backend("CSX", artifact_dir=tmp)
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(io_input_fn, steps, sleep_s), num_steps=steps,
            cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
        for _ in executor:
            pass
        backend.shutdown()
    report, stream = executor.report, executor.summary["workers"][0]
    costs = [w["batch_cost_p50_s"] for w in report["input_assignment"]["workers"]
             if w["batch_cost_p50_s"]]
    ideal = workers / statistics.median(costs)
    coord = stream["coordinator"]
    per = max(coord["numbers_assigned"], 1)
    return {
        "workers": workers, "steps": steps,
        "batches_per_s": report["samples_per_s"], "ideal_batches_per_s": ideal,
        "efficiency": report["samples_per_s"] / ideal,
        "batch_cost_p50_ms": 1000 * statistics.median(costs),
        "workers_per_node": sorted(collections.Counter(
            n["node_id"] for n in report["worker_nodes"]).values()),
        "coordinator_cpu_us_per_batch": 1e6 * coord["thread_cpu_s"] / per,
        "issuing_us_per_batch": 1e6 * coord["issuing_cpu_s"] / per,
        "numbers_assigned": coord["numbers_assigned"],
        "starved_fraction": report["starved_fraction"],
        "restarts": report.get("worker_restarts", 0),
    }


def summarize(runs: list, workers: list) -> list:
    rows = []
    for n in workers:
        mine = [r for r in runs if r["workers"] == n]
        rows.append({"workers": n, "rounds": len(mine), **{
            k: statistics.median(r[k] for r in mine)
            for k in ("batches_per_s", "ideal_batches_per_s", "efficiency",
                      "batch_cost_p50_ms", "coordinator_cpu_us_per_batch",
                      "issuing_us_per_batch")},
            "workers_per_node": mine[0]["workers_per_node"]})
    return rows


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["medians"]
    n = [r["workers"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(n, [r["batches_per_s"] for r in rows], "o-", label="cstream, 3 nodes")
    a.plot(n, [r["ideal_batches_per_s"] for r in rows], "k--", label="N / batch cost")
    a.set(xlabel="input workers", ylabel="batches/s reaching the wafer",
          title=f"I/O-like input ({results['setup']['sleep_ms']:.0f} ms a batch)")
    a.legend()
    b.plot(n, [r["coordinator_cpu_us_per_batch"] for r in rows], "o-",
           label="coordinator thread CPU")
    b.plot(n, [r["issuing_us_per_batch"] for r in rows], "s-",
           label="of which issuing numbers")
    b.set(xlabel="input workers", ylabel="µs per assigned batch",
          title="dynamic assignment's cost per batch")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


class _Slow:
    def hold(self, s):
        import time as _time

        _time.sleep(s)


def probe_per_worker_costs(sizes=(16, 128, 1024)) -> dict:
    """What the coordinator's per-round work costs per worker, for the extrapolation: Ray's
    ``ray.wait(refs, num_returns=1, timeout=0)`` over W outstanding replies (calls queued on
    one actor that sleeps), and sizing a worker's assignment (``numbers_per_worker``'s median
    of its 64 recent batch costs), both done once per worker per pump round."""
    import random

    out = {}
    holder = ray.remote(_Slow).options(max_concurrency=1).remote()
    ray.get(holder.hold.remote(0))
    for w in sizes:
        refs = [holder.hold.remote(30 if i == 0 else 0) for i in range(w)]
        time.sleep(0.5)  # the first holds the actor: the others stay pending
        pending = [r for r in refs if not ray.wait([r], timeout=0)[0]]
        t0 = time.perf_counter()
        for _ in range(20):
            ray.wait(pending, num_returns=1, timeout=0, fetch_local=False)
        out[f"ray_wait_us_per_ref_w{w}"] = 1e6 * (time.perf_counter() - t0) / 20 / len(pending)
        ray.cancel(refs[0], force=False)
    ray.kill(holder)
    recent = [random.random() for _ in range(64)]
    t0 = time.perf_counter()
    for _ in range(20000):
        sorted(recent)[len(recent) // 2]
    out["median_of_64_costs_us"] = 1e6 * (time.perf_counter() - t0) / 20000
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", default="4,8,16")
    p.add_argument("--batches-per-worker", type=int, default=100)
    p.add_argument("--sleep-ms", type=float, default=20.0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "multinode.json"))
    p.add_argument("--probe-only", action="store_true",
                   help="measure the per-worker costs only and add them to --out")
    args = p.parse_args(argv)
    if args.probe_only:
        import json

        ray.init(include_dashboard=False, num_cpus=2)
        try:
            probe = probe_per_worker_costs()
        finally:
            ray.shutdown()
        results = json.loads(Path(args.out).read_text())
        results["per_worker_probe"] = probe
        save_results(results, args.out, plot)
        print(probe)
        return
    workers = [int(x) for x in args.workers.split(",")]
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args=NODE_ARGS)
    runs = []
    try:
        for _ in range(NODES - 1):
            cluster.add_node(**NODE_ARGS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        for r in range(args.rounds):
            for n in (workers if r % 2 == 0 else workers[::-1]):
                got = run(n, n * args.batches_per_worker, args.sleep_ms / 1000)
                got["round"] = r
                runs.append(got)
                print(f"round {r} workers {n}: {got['batches_per_s']:.1f} batches/s "
                      f"({100 * got['efficiency']:.1f}% of ideal), coordinator "
                      f"{got['coordinator_cpu_us_per_batch']:.0f} µs/batch", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    results = {
        "setup": {"nodes": NODES, "cpus_per_node": NODE_ARGS["num_cpus"],
                  "sleep_ms": args.sleep_ms, "batches_per_worker": args.batches_per_worker,
                  "rounds": args.rounds, "machine_cpus": os.cpu_count(),
                  "load_average_at_start": os.getloadavg(), "ray": ray.__version__,
                  "torch": torch.__version__, "wall_s": time.time() - t0,
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "runs": runs, "medians": summarize(runs, workers)}
    save_results(results, args.out, plot)


if __name__ == "__main__":
    main()
