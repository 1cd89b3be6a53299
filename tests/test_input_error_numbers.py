"""The numbers in an input error are true under either assignment mode.

An ``input_fn`` whose data set fails on one global batch: the error must name that global
batch, the step that consumes it, the worker that was producing it and that worker's own count
of its batches -- under round-robin (static) assignment and under dynamic assignment, where a
worker's batches are not every ``W``-th step.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from workers import CSConfig
from workers.dataloader import DataLoader
from workers.errors import InputWorkerError
from workers.flow import FlowPolicy
from workers.sharding import ShardedSampler
from workers.stream import configured_stream


FAIL_AT = 13  # the global batch that fails (0-based): step 14
READ_TIMEOUT_S = 300.0  # far beyond what a loaded machine needs
BATCH = 4


def failing_rows_fn(n=80):
    """Global batches of row numbers; a row of global batch FAIL_AT raises, naming the worker
    that read it and how many batches that worker had made before. Worker 0's first batch is
    slow, so that under dynamic assignment the other workers take more than their round-robin
    share."""
    import time

    from workers import get_worker_info

    info = get_worker_info()
    made = {"rows": 0}
    rows_per_batch = BATCH // info.num_csx  # this CS-X's slice of a global batch

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            if i // BATCH == FAIL_AT:
                raise ValueError(f"row {i} is corrupt (read by worker {info.local_worker_id} "
                                 f"after {made['rows'] // rows_per_batch} batches)")
            if info.local_worker_id == 0 and made["rows"] == 0:
                time.sleep(0.3)
            made["rows"] += 1
            return torch.tensor(i)

    batches = BatchSampler(SequentialSampler(range(n)), BATCH, drop_last=True)
    return torch.utils.data.DataLoader(Rows(), batch_sampler=ShardedSampler(batches))


HEAD = re.compile(r"CS-X 0, input worker (\d+) of (\d+), global batch (\d+) \(step (\d+), the "
                  r"worker's batch (\d+)\): input_fn failed while producing this batch: "
                  r"ValueError: row (\d+) is corrupt \(read by worker (\d+) after (\d+) batches\)$")


def fail(mode, C, W):
    """Stream until the error; returns the steps streamed, the error and its parsed head."""
    cfg = CSConfig(num_csx=C, num_workers_per_csx=W, input_assignment=mode,
                   straggler_timeout_s=30.0)
    policy = FlowPolicy.from_config(cfg, small_reply_batches=1, assigned_batches_per_worker=2)
    streams = [configured_stream(DataLoader(failing_rows_fn), cfg, c, policy=policy,
                                      name_prefix=f"err-{mode}{C}x{W}") for c in range(C)]
    steps, error = [], []

    def read():  # in a thread, so that the test's wait for the error is bounded
        try:
            for _ in range(FAIL_AT + 2):
                for s in streams:
                    s.next()
                steps.append(True)
        except BaseException as e:  # noqa: BLE001 (checked below)
            error.append(e)

    try:
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(READ_TIMEOUT_S)
        assert not reader.is_alive(), f"no error after {len(steps)} steps and {READ_TIMEOUT_S} s"
        modes = {s.stats()["assignment"]["mode"] for s in streams}
    finally:
        for s in streams:
            s.close()
    assert modes == {mode}
    assert len(error) == 1 and isinstance(error[0], InputWorkerError), error
    m = HEAD.match(str(error[0]).splitlines()[0])
    assert m, str(error[0]).splitlines()[0]
    return len(steps), error[0], [int(x) for x in m.groups()]


@pytest.mark.parametrize("C,W", [(1, 3), (2, 2)])
def test_a_static_run_names_the_global_batch_step_and_worker_that_failed(ray_session, C, W):
    steps, e, (w, of, g, step, its, row, reader, made) = fail("static", C, W)
    assert steps == FAIL_AT
    # round-robin: worker 13 % W made it as its batch 13 // W
    assert (w, of, g, step, its) == (FAIL_AT % W, W, FAIL_AT, FAIL_AT + 1, FAIL_AT // W)
    assert (reader, made) == (w, its)
    assert row // BATCH == FAIL_AT
    assert (e.global_batch, e.step, e.local_worker_id, e.batch) == (FAIL_AT, FAIL_AT + 1, w, its)


@pytest.mark.parametrize("C,W", [(1, 3), (2, 2)])
def test_a_dynamic_run_names_the_global_batch_step_and_worker_that_failed(ray_session, C, W):
    steps, e, (w, of, g, step, its, row, reader, made) = fail("dynamic", C, W)
    assert steps == FAIL_AT
    assert (of, g, step) == (W, FAIL_AT, FAIL_AT + 1)
    # the worker named is the one whose input_fn raised, and its count is that worker's own
    assert (reader, made) == (w, its)
    assert row // BATCH == FAIL_AT
    assert (e.global_batch, e.step, e.local_worker_id, e.batch) == (FAIL_AT, FAIL_AT + 1, w, its)
