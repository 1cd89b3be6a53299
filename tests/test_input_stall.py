"""A stall is diagnosed, not endured: an input_fn stuck for ever in one worker ends the run with
``cstream.InputStallError`` once the wafer has waited longer than
``CSConfig.input_stall_timeout_s``, naming the CS-X, the worker, the global batches it owes and
the user's blocking line in its stack; a slow batch under the bound changes nothing."""

from __future__ import annotations

import collections
import os
import threading
import time

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

import cstream as cstorch
from workers.config import CSConfig
from workers.stall import STALL_COST_FACTOR, STALL_FLOOR_S, stall_bound

from helpers.cli import cstream, table_rows
from helpers.runs import record_run, whole_batch
from helpers.streams import cstream_actors

HERE = os.path.abspath(__file__)
STALL_LINE = "_GATES[gate].wait()  # the stall: nothing sets this gate in a worker"

# in-process runs block their feeder thread on a gate of this process, set when the test ends; an
# input worker's process has gates of its own that nothing sets
_GATES: dict = collections.defaultdict(threading.Event)


def stalling_input_fn(n=64, batch=4, stuck_worker=1, stuck_at=2, gate="", sleep_s=0.0,
                      stuck_csx=0):
    """Global batches of sample ids (``ShardedSampler``: dynamic assignment can take part).
    Worker ``stuck_worker`` of CS-X ``stuck_csx``: its batch number ``stuck_at`` (its own
    count, from 0) waits on ``gate`` for ever, or, with ``sleep_s``, sleeps that long once."""
    info = cstorch.distributed.get_worker_info()
    w = info.local_worker_id if info.wse_id == stuck_csx else None
    ids = torch.arange(n)
    samples = {"read": 0}

    class Ids(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            if w == stuck_worker:
                samples["read"] += 1
                if samples["read"] == stuck_at * batch + 1:
                    if sleep_s:
                        time.sleep(sleep_s)
                    else:
                        _GATES[gate].wait()  # the stall: nothing sets this gate in a worker
            return ids[i]

    batches = BatchSampler(SequentialSampler(range(n)), batch_size=batch, drop_last=True)
    return torch.utils.data.DataLoader(Ids(), batch_sampler=cstorch.utils.data.ShardedSampler(
        batches))


def run_ids(steps, cs_config, in_process, **kwargs):
    """Run ``steps`` steps of :func:`stalling_input_fn`; the ids each finished step's closure
    saw, in order, and the InputStallError that ended the run (or None)."""
    run = record_run("CSX", stalling_input_fn, steps, cs_config, value=whole_batch,
                     expect=cstorch.InputStallError, loader_options=kwargs,
                     in_process=in_process)
    return run.seen, run.error


def _gone(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def check_stall_message(e, step_expected=None, worker=1, owed_first=None):
    """The message names CS-X 0, the stuck ``worker``, the global batch and step it owes, and
    the user's blocking line (the user's frames before the rest of the stack); returns the
    worker's pid."""
    msg = str(e)
    assert msg.startswith(
        f"the wafer waited {e.waited_s:.1f} s for the input of step {e.step} from CS-X 0, "
        "longer than the bound of 3 s (CSConfig.input_stall_timeout_s=3); the run was stopped")
    assert e.waited_s > 3
    if step_expected is not None:
        assert e.step == step_expected
    stuck = e.owed[0]
    assert (stuck["wse_id"], stuck["local_worker_id"]) == (0, worker)
    # no resume: global batch N is step N + 1 of the run; the awaited one comes first
    assert stuck["batches"][0] == (owed_first or (e.step - 1, e.step))
    owes = ", ".join(f"global batch {n} (step {s})" for n, s in stuck["batches"])
    assert f"CS-X 0, input worker {worker} (pid {stuck['pid']}) owes {owes}." in \
        msg.splitlines()
    assert STALL_LINE in msg
    yours = msg.index(f'File "{HERE}", line ')
    assert msg[yours:].split("\n", 1)[0].endswith("in __getitem__")
    assert yours < msg.index("its whole stack") < msg.index("threading.py")
    assert "cstream.utils.CSConfig(input_stall_timeout_s=SECONDS)" in msg
    return stuck["pid"]


@pytest.mark.timeout(300)  # a stall that is not diagnosed hangs here; a slow start does not
@pytest.mark.parametrize("assignment", ["dynamic", "static"])
def test_a_worker_stuck_for_ever_ends_the_run_with_input_stall_error_naming_it(
        ray_session, assignment):
    ray = ray_session
    before = cstream_actors(ray)
    cs = CSConfig(num_workers_per_csx=2, input_stall_timeout_s=3, input_assignment=assignment)
    seen, e = run_ids(40, cs, in_process=False, gate="ray")
    assert e is not None, "the run ended without a stall"
    # round-robin: worker 1 makes steps 2, 4, 6, ...; its third batch is step 6
    pid = check_stall_message(e, 6 if assignment == "static" else None)
    # every step before the stuck one ran, in order, and had its closure
    assert seen == list(range(4 * (e.step - 1)))
    if assignment == "dynamic":  # the stuck worker holds the step's global batch
        assert len(e.owed[0]["batches"]) >= 1 and all(
            o["local_worker_id"] != 1 for o in e.owed[1:])
    # the stuck worker was killed: its actor and its process are gone
    deadline = time.time() + 60  # killed actors leave asynchronously; a busy machine is slower
    while (cstream_actors(ray) != before or not _gone(pid)) and time.time() < deadline:
        time.sleep(0.2)
    assert cstream_actors(ray) == before
    assert _gone(pid)


@pytest.mark.timeout(120)
def test_in_process_a_stuck_input_fn_ends_the_run_with_the_stack_of_its_thread():
    try:
        seen, e = run_ids(40, CSConfig(num_workers_per_csx=2, input_stall_timeout_s=3),
                          in_process=True, gate="in-process")
    finally:
        _GATES["in-process"].set()  # the stuck feeder thread of this process ends
    assert e is not None, "the run ended without a stall"
    assert check_stall_message(e, 6) == os.getpid()
    assert seen == list(range(20))
    assert [t["thread"] for t in e.owed[0]["threads"]] == ["feeder-csx0"]


def stuck_build_input_fn():
    _GATES["build"].wait()  # the loader is never built
    return [torch.ones(2)]


@pytest.mark.timeout(120)
def test_a_worker_stuck_in_input_fn_answers_for_its_stacks_while_its_other_calls_wait(
        ray_session):
    from workers.context import WorkerInfo
    from workers.dataloader import DataLoader
    from workers.input_worker import InputWorker

    ray = ray_session
    actor = InputWorker.options(num_cpus=0.01, max_concurrency=2).remote(
        DataLoader(stuck_build_input_fn), WorkerInfo(0, 1, 1, 0), dynamic=True)
    try:
        waiting = [actor.assignment_mode.remote(600),  # the control thread waits for the build
                   actor.fetch.remote(0)]  # a fetch thread waits for the producer
        got = ray.get(actor.thread_stacks.remote(), timeout=60)
        assert ray.wait(waiting, num_returns=2, timeout=0)[0] == []  # both still wait
        producer = got["threads"][0]  # user code first
        assert producer["thread"] == "input-worker-csx0-w0"
        assert (HERE, "stuck_build_input_fn", '_GATES["build"].wait()  # the loader is never '
                "built") in [(f[0], f[2], f[3]) for f in producer["frames"]]
        assert _gone(got["pid"]) is False
    finally:
        ray.kill(actor)


@pytest.mark.timeout(120)
def test_with_two_cs_x_the_error_names_the_one_whose_part_is_missing():
    try:
        seen, e = run_ids(20, CSConfig(num_csx=2, num_workers_per_csx=2,
                                       input_stall_timeout_s=3),
                          in_process=True, gate="two-csx", stuck_csx=1)
    finally:
        _GATES["two-csx"].set()
    assert e is not None, "the run ended without a stall"
    # a CS-X's slice of a global batch of 4 holds 2 samples: the stuck worker's 9th sample is
    # in its 5th batch, step 10 (round-robin over 2 workers)
    assert str(e).startswith("the wafer waited ") and " for the input of step 10 from CS-X 1, " \
        "longer than the bound of 3 s" in str(e).splitlines()[0]
    assert [(o["wse_id"], o["local_worker_id"], o["batches"]) for o in e.owed] == [
        (1, 1, [(9, 10)])]
    assert [t["thread"] for t in e.owed[0]["threads"]] == ["feeder-csx1"]
    assert STALL_LINE in str(e)
    assert seen == list(range(36))  # steps 1..9, both CS-Xs' halves joined


@pytest.mark.timeout(300)
@pytest.mark.parametrize("in_process", [False, True])
def test_a_first_batch_that_never_comes_ends_the_run_before_its_first_step(request, in_process):
    ray = None if in_process else request.getfixturevalue("ray_session")
    before = None if in_process else cstream_actors(ray)
    gate = f"first-{in_process}"
    try:
        seen, e = run_ids(10, CSConfig(num_workers_per_csx=2, input_stall_timeout_s=3),
                          in_process=in_process, gate=gate, stuck_worker=0, stuck_at=0)
    finally:
        _GATES[gate].set()
    assert e is not None, "the run ended without a stall"
    pid = check_stall_message(e, 1, worker=0)
    assert e.owed[0]["batches"][0] == (0, 1) and seen == []
    if not in_process:  # the input workers were killed with the run
        deadline = time.time() + 60
        while (cstream_actors(ray) != before or not _gone(pid)) and time.time() < deadline:
            time.sleep(0.2)
        assert cstream_actors(ray) == before and _gone(pid)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("in_process", [False, True])
def test_a_worker_stuck_before_the_duplicate_check_has_its_first_batches_is_named(
        request, in_process):
    """The first step waits for the check of every worker's first batches (duplicates): a
    worker stuck at its first batch, other than the first step's, holds it up."""
    if not in_process:
        request.getfixturevalue("ray_session")
    gate = f"keys-{in_process}"
    try:
        seen, e = run_ids(10, CSConfig(num_workers_per_csx=2, input_stall_timeout_s=3),
                          in_process=in_process, gate=gate, stuck_worker=1, stuck_at=0)
    finally:
        _GATES[gate].set()
    assert e is not None, "the run ended without a stall"
    # round-robin (in-process), worker 1's first batch is global batch 1; under dynamic
    # assignment it holds whichever numbers it was given, 1 the first (fewest held first)
    check_stall_message(e, 1, worker=1, owed_first=(1, 2))
    assert seen == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("in_process", [False, True])
def test_a_batch_slow_once_for_less_than_the_bound_changes_nothing(request, in_process):
    if not in_process:
        request.getfixturevalue("ray_session")
    cs = CSConfig(num_workers_per_csx=2, input_stall_timeout_s=5)
    seen, e = run_ids(20, cs, in_process=in_process, sleep_s=1.0)
    assert e is None
    assert seen == list(range(64)) + list(range(16))  # 16 global batches an epoch, in order


def test_the_default_bound_follows_the_slowest_batch_with_a_floor():
    assert stall_bound(CSConfig(), None) == (
        STALL_FLOOR_S, f"the default, max({STALL_FLOOR_S:g} s, {STALL_COST_FACTOR} x the slowest "
        "batch so far: none seen yet)")
    assert stall_bound(CSConfig(), 0.5)[0] == STALL_FLOOR_S
    assert stall_bound(CSConfig(), 60.0)[0] == STALL_COST_FACTOR * 60.0
    assert stall_bound(CSConfig(input_stall_timeout_s=2.5), 60.0) == (
        2.5, "CSConfig.input_stall_timeout_s=2.5")
    for bad in (0, -1, True, "10"):
        with pytest.raises(ValueError, match="CSConfig.input_stall_timeout_s: expected a "
                                             "positive number of seconds or None"):
            CSConfig(input_stall_timeout_s=bad)


def test_the_error_pickles_whole():
    import pickle

    e = cstorch.InputStallError(6, 3.4, 3.0, "CSConfig.input_stall_timeout_s=3", [
        {"wse_id": 0, "local_worker_id": 1, "pid": 7, "batches": [(5, 6)], "threads": [
            {"thread": "t", "frames": [(HERE, 3, "f", "x = 1")]}], "note": ""}])
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.owed == e.owed and back.step == 6


STALLS = '''\
import threading

import torch


def input_fn(stuck_at=2):
    from cstream.distributed import get_worker_info

    return Batches(get_worker_info().local_worker_id, stuck_at)


class Batches:
    def __init__(self, worker, stuck_at):
        self.worker, self.stuck_at = worker, stuck_at

    def __iter__(self):
        for i in range(1000):
            if self.worker == 1 and i == self.stuck_at:
                threading.Event().wait()  # waits for a lock nobody releases
            yield torch.full((4, 3), float(i + 1000 * self.worker))
'''

STALL_RUN = """\
name: stall
cs_config: {num_workers_per_csx: 2, wafer_seconds_per_step: 0.005, input_stall_timeout_s: 3}
input: {fn: "stalls:input_fn", kwargs: {stuck_at: 2}}
model: null
steps: 12
backend: {type: CSX, options: {in_process: true}}
"""


@pytest.mark.timeout(300)
def test_the_cli_prints_the_stall_diagnosis(tmp_path):
    (tmp_path / "stalls.py").write_text(STALLS)
    (tmp_path / "stall.yaml").write_text(STALL_RUN)
    out = cstream("run", "stall.yaml", "--artifact-dir", "art", "--no-progress", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    err = out.stderr.splitlines()
    head = next(i for i, ln in enumerate(err) if ln.startswith("cstream run: error: "))
    assert err[head].startswith("cstream run: error: InputStallError: the wafer waited ")
    assert err[head].endswith(" s for the input of step 6 from CS-X 0, longer than the bound of "
                              "3 s (CSConfig.input_stall_timeout_s=3); the run was stopped.")
    assert err[head + 1] == f"CS-X 0, input worker 1 (pid {_pid_in(err[head + 1])}) owes " \
                            "global batch 5 (step 6)."
    assert err[head + 2] == '  Thread "feeder-csx0", in your code (innermost last):'
    assert f'    File "{tmp_path / "stalls.py"}", line 19, in __iter__' in err
    assert "      threading.Event().wait()  # waits for a lock nobody releases" in err
    assert any(ln.startswith("If the input is slow rather than stuck, raise the bound: "
                             "cstream.utils.CSConfig(input_stall_timeout_s=SECONDS)")
               for ln in err)
    assert "Traceback" not in out.stderr
    # the steps that ran are kept: a partial summary
    rows = table_rows(out.stdout)
    assert rows["INTERRUPTED"].startswith("after 5 of 12 steps: InputStallError: the wafer ")


def _pid_in(line: str) -> int:
    return int(line.split("(pid ")[1].split(")")[0])
