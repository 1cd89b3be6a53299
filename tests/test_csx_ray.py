"""The simulated Wafer-Scale Cluster on Ray: input workers as actors, the driver as an actor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

import cstream as cstorch

from helpers.cli import child_env
from helpers.runs import train_by_hand
from helpers.streams import cstream_actors

REPO = Path(__file__).resolve().parents[1]


def global_batches_input_fn(n=48, batch_size=8):
    """Fixed global batches of (features, labels); ShardedSampler gives each worker its share."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
    batches = BatchSampler(SequentialSampler(range(n)), batch_size=batch_size, drop_last=True)
    return torch.utils.data.DataLoader(
        TensorDataset(x, y), batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def small_mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def train(kind, cs_config=None, steps=9, on_step=None, **options):
    """Losses and final weights of SGD with momentum, by hand, on the global batches."""
    run = train_by_hand(kind, small_mlp, global_batches_input_fn, steps=steps, lr=0.2,
                        momentum=0.5, cs_config=cs_config, build_on_device=True,
                        on_step=on_step, **options)
    return run.losses, run.final


@pytest.fixture(scope="module")
def cpu_reference():
    from executor import runtime

    runtime.reset()
    ref = train("CPU")
    runtime.reset()
    return ref


@pytest.mark.parametrize("num_csx,workers", [(1, 4), (2, 2)])
def test_training_on_ray_equals_the_cpu_backend_on_the_same_global_batches(
        ray_session, cpu_reference, num_csx, workers):
    cfg = cstorch.utils.CSConfig(num_csx=num_csx, num_workers_per_csx=workers)
    losses, final = train("CSX", cfg)
    ref_losses, ref_final = cpu_reference
    assert len(losses) == 9  # 6 global batches an epoch: the run crosses into epoch 2
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-5
    for k in ref_final:
        assert torch.allclose(final[k], ref_final[k], atol=1e-5), k


def test_rate_read_in_closures_is_timed_by_the_wafers_step_ends(ray_session):
    # one collect brings the outputs of several steps and their closures then run back to back:
    # rate() and global_rate() read in them measure the wafer's pace, from its step ends
    torch.manual_seed(0)
    backend = cstorch.backend("CSX", in_process=True)
    with backend.device:
        model = torch.nn.Linear(6, 3)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    read = []

    @cstorch.step_closure
    def record(loss):
        loss.item()
        read.append((executor.profiler.rate(), executor.profiler.global_rate()))

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(global_batches_input_fn), num_steps=12,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=1, wafer_seconds_per_step=0.004))
    for batch in executor:
        record(step(batch))
    backend.shutdown()
    ends = [r["end_unix"] for r in executor.step_records]
    assert len(read) == len(ends) == 12
    # the expected figures from the wafer's step ends (unix seconds, ~2.4e-7 s apart as
    # doubles, against steps held >= 4 ms: 1e-3 of a figure covers the rounding)
    assert read[0] == (0.0, 0.0)
    previous = None
    for k in range(1, 12):
        current = 8 / (ends[k] - ends[k - 1])
        previous = current if previous is None else 0.6 * current + 0.4 * previous
        assert read[k][0] == pytest.approx(previous, rel=1e-3), k
        assert read[k][1] == pytest.approx(8 * k / (ends[k] - ends[0]), rel=1e-3), k


@pytest.mark.timeout(900)  # three runs' actor start-ups on a loaded machine; a hang still fails
def test_no_actor_is_left_after_a_normal_end_an_exception_and_a_keyboard_interrupt(ray_session):
    ray = ray_session
    before = cstream_actors(ray)

    def body(fail):
        backend = cstorch.backend("CSX")
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(global_batches_input_fn), num_steps=20,
            cs_config=cstorch.utils.CSConfig(num_workers_per_csx=2))
        try:
            for i, _ in enumerate(executor):
                if fail is not None and i == 3:
                    raise fail
        finally:
            backend.shutdown()

    body(None)
    with pytest.raises(ValueError):
        body(ValueError("boom"))
    with pytest.raises(KeyboardInterrupt):
        body(KeyboardInterrupt())
    deadline = time.time() + 60  # killed actors leave asynchronously; a busy machine is slower
    while cstream_actors(ray) != before and time.time() < deadline:
        time.sleep(0.2)
    assert cstream_actors(ray) == before


@pytest.mark.timeout(600)  # a run that hangs on the failed worker fails here, a slow one does not
def test_an_input_fn_error_names_the_worker_and_carries_the_original_traceback(ray_session):
    backend = cstorch.backend("CSX")

    def broken_input_fn():
        info = cstorch.distributed.get_worker_info()
        if info.local_worker_id == 1:
            raise KeyError("missing column 'label'")
        return [torch.ones(2, 2)] * 4

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(broken_input_fn), num_steps=4,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=2))
    with pytest.raises(Exception) as info:
        for _ in executor:
            pass
    msg = str(info.value)
    assert "worker 1" in msg and "CS-X 0" in msg
    assert "KeyError" in msg and "missing column 'label'" in msg
    assert "broken_input_fn" in msg  # the original traceback
    backend.shutdown()


TWO_NODES = textwrap.dedent("""
    import os, sys
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray, torch
    from ray.cluster_utils import Cluster
    import cstream as cstorch
    import test_csx_ray

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2,
                      "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    print("nodes", len([n for n in ray.nodes() if n["Alive"]]))

    placed = set()

    @cstorch.step_closure
    def where(loss):
        for info in ray._private.state.actors().values():
            if (info.get("Name") or "").startswith("cstream-csx") and info["State"] == "ALIVE":
                placed.add(info["Address"]["NodeID"])

    real_record = test_csx_ray.train
    losses, _ = test_csx_ray.train("CSX", cstorch.utils.CSConfig(num_workers_per_csx=4),
                                   steps=6, address=cluster.address, on_step=where)
    print("losses", len(losses))
    print("worker nodes", len(placed))
    ray.shutdown()
    cluster.shutdown()
""")


def test_workers_spread_over_a_two_node_ray_cluster_and_train(tmp_path):
    script = tmp_path / "two_nodes.py"
    script.write_text(TWO_NODES)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=child_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"), timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "nodes 2" in out.stdout
    assert "losses 6" in out.stdout
    assert "worker nodes 2" in out.stdout


def test_ctrl_c_ends_a_run_within_seconds_and_leaves_no_ray_process(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time, torch
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        import cstream as cstorch

        def slow_input_fn():
            class Slow(torch.utils.data.IterableDataset):
                def __iter__(self):
                    while True:
                        time.sleep(0.05)
                        yield torch.ones(4, 2)
            return torch.utils.data.DataLoader(Slow(), batch_size=None)

        backend = cstorch.backend("CSX")
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(slow_input_fn), num_steps=100000,
            cs_config=cstorch.utils.CSConfig(num_workers_per_csx=2))
        try:
            for i, _ in enumerate(executor):
                if i == 5:
                    print("running", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        # a second run in the same process works
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(slow_input_fn), num_steps=3)
        print("second run", sum(1 for _ in executor), flush=True)
        backend.shutdown()
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                            # Ctrl-C's default action in the child, even when this test runs
                            # with SIGINT ignored (a runner started in the background)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = ""
    deadline = time.time() + 120
    while "running" not in line and time.time() < deadline:
        line = proc.stdout.readline()
    assert "running" in line
    proc.send_signal(signal.SIGINT)
    # the interrupt, a second run and the shutdown end the process: a hang, not a slow machine,
    # runs past this bound
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted" in out and "second run 3" in out
    # nothing of that process's Ray is left (its processes may take a moment to exit)
    deadline = time.time() + 60
    while True:
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
        if not left.stdout.strip() or time.time() > deadline:
            break
        time.sleep(0.2)
    assert left.stdout.strip() == ""


def ids_sharded_input_fn(n=24, batch=2):
    """Global batches of sample ids, ShardedSampler over a BatchSampler: restartable."""
    ids = torch.arange(n * batch)
    batches = BatchSampler(SequentialSampler(range(n * batch)), batch_size=batch, drop_last=True)
    return torch.utils.data.DataLoader(
        TensorDataset(ids), batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def _ids_run(steps, workers, resume=None, checkpoint_steps=None):
    backend = cstorch.backend("CSX")
    seen, states = [], {}
    loader = cstorch.utils.data.DataLoader(ids_sharded_input_fn)
    if resume is not None:
        loader.load_state_dict(resume)

    @cstorch.checkpoint_closure
    def checkpoint(i):
        states[i] = loader.state_dict()

    executor = cstorch.utils.data.DataExecutor(
        loader, num_steps=steps, checkpoint_steps=checkpoint_steps,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
    compiled = cstorch.compile(torch.nn.Linear(1, 1), backend)

    @cstorch.trace
    def step(batch):
        return batch[0] + compiled.weight.sum().to(torch.int64) * 0

    @cstorch.step_closure
    def record(ids):
        seen.extend(ids.tolist())

    for i, batch in enumerate(executor):
        record(step(batch))
        checkpoint(i)
    backend.shutdown()
    return seen, states


def test_on_ray_a_resume_continues_the_sequence_also_with_another_worker_count(ray_session):
    full = list(range(48)) + list(range(8))  # 24 global batches of 2 ids, then a new epoch
    first, states = _ids_run(9, workers=2, checkpoint_steps=5)
    assert first == full[:18]
    second, states2 = _ids_run(10, workers=3, resume=states[4], checkpoint_steps=10)
    assert first[:10] + second == full[:30]
    third, _ = _ids_run(8, workers=4, resume=states2[9])      # crosses the epoch boundary
    assert first[:10] + second + third == full[:46]
