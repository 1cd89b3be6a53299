"""Dynamic assignment with loaders that draw index batches ahead of the batch they yield.

A torch ``DataLoader(num_workers=n)`` draws ``prefetch_factor * n`` index batches from its
sampler when its iterator is created, before it yields anything; a prefetching sampler wrapper
draws its own read-ahead. Under dynamic assignment a ``ShardedSampler`` draws a batch only once
the worker holds its global batch number, so such a loader needs numbers beyond the one it
produces (workers/coordinator.py grants them). The tests assert the wafer's sequence of global
batches, that every sample of an epoch comes once, and that a resume continues exactly.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler

from workers import CSConfig
from workers.context import BatchAssignment, WorkerInfo, batch_assignment, worker_context
from workers.dataloader import DataLoader
from workers.resume import Source
from workers.loaders import draws_ahead, dynamic_assignment_support
from workers.sharding import ShardedSampler

from helpers.runs import record_run, whole_batch
from helpers.streams import SampleIds, client_sequence, close_all, open_streams, read_steps

N, BATCH = 24, 4  # 6 global batches an epoch
EPOCH = N // BATCH


class ReadAhead:
    """A user's prefetching batch sampler: it keeps ``ahead`` index batches of the sampler it
    wraps drawn ahead of the one it yields (as a sampler that fetches from remote storage
    would)."""

    def __init__(self, sampler, ahead):
        self.sampler = sampler
        self.ahead = ahead

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        drawn = []
        for batch in self.sampler:
            drawn.append(batch)
            if len(drawn) > self.ahead:
                yield drawn.pop(0)
        yield from drawn


def ids_fn(num_workers=2, prefetch_factor=None, persistent_workers=False, pin_memory=False,
           read_ahead=0, in_order=True):
    """Global batches of sample ids, reshuffled every epoch by the sampler's own generator."""
    order = RandomSampler(range(N), generator=torch.Generator().manual_seed(11))
    sampler = ShardedSampler(BatchSampler(order, batch_size=BATCH, drop_last=True))
    if read_ahead:
        sampler = ReadAhead(sampler, read_ahead)
    options = {}
    if num_workers:
        options = dict(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                       in_order=in_order)
    return torch.utils.data.DataLoader(SampleIds(N), batch_sampler=sampler, num_workers=num_workers,
                                       pin_memory=pin_memory, **options)


def run_and_resume(cfg, prefix, loader, first_steps, rest, **options):
    """Stream ``first_steps``, close, resume from the worker states, stream ``rest`` more;
    returns both parts and the assignment stats of each stream."""
    streams = open_streams(cfg, f"{prefix}-a", loader, **options)
    try:
        first, _ = read_steps(streams, first_steps)
        states = [st for s in streams for st in s.worker_states()]
        stats = [s.stats()["assignment"] for s in streams]
    finally:
        close_all(streams)
    streams = open_streams(cfg, f"{prefix}-b", loader, resume=states, **options)
    try:
        second, _ = read_steps(streams, rest)
        stats += [s.stats()["assignment"] for s in streams]
    finally:
        close_all(streams)
    return first, second, stats


def assert_exactly_once_per_epoch(seq):
    for e in range(len(seq) // EPOCH):
        counts = Counter(i for b in seq[EPOCH * e:EPOCH * (e + 1)] for i in b)
        assert counts == Counter(range(1000, 1000 + N)), f"epoch {e}"


# ---------------------------------------------------------------------------------------------
# In-process: what the loader draws ahead, and the sampler's position after what it yielded
# ---------------------------------------------------------------------------------------------

def test_the_look_ahead_of_a_loader_is_prefetch_factor_times_its_processes():
    assert draws_ahead(ids_fn(num_workers=0)) == 0
    assert draws_ahead(ids_fn(num_workers=2)) == 4
    assert draws_ahead(ids_fn(num_workers=2, prefetch_factor=3)) == 6
    assert draws_ahead([torch.zeros(2)]) == 0


def test_which_prefetching_loaders_can_be_assigned_dynamically():
    assert dynamic_assignment_support(ids_fn(num_workers=2))[0]
    assert dynamic_assignment_support(ids_fn(num_workers=0, read_ahead=3))[0]  # wrapper.sampler
    ok, why = dynamic_assignment_support(ids_fn(num_workers=2, in_order=False))
    assert not ok and "in_order=False" in why and "leave in_order=True" in why


def test_a_read_ahead_sampler_saves_the_position_after_the_batches_the_loader_yielded():
    loader = DataLoader(ids_fn, num_workers=0, read_ahead=3)
    source = Source(loader, loader.build())
    for _ in range(2):
        next(source)
    state = source.position()["loader_state"]
    # the wrapper drew 6 index batches (all of epoch 0) to yield 2: the position is after 2
    assert state["next_global_batch"] == 2
    resumed = Source(loader, loader.build(), source.position())
    assert [next(resumed).tolist() for _ in range(6)] == \
        client_sequence(ids_fn, 8, num_workers=0)[2:]


def test_a_dynamic_worker_reports_a_look_ahead_it_was_not_granted():
    woken = []
    assignment = BatchAssignment(on_wait_ahead=lambda: woken.append(True))
    assignment.extend(0, [0, 1])
    loader = DataLoader(ids_fn, num_workers=0, read_ahead=2)
    got = []

    def produce():  # as an input worker's producer thread
        with worker_context(WorkerInfo()), batch_assignment(assignment):
            source = Source(loader, loader.build())
            got.append(next(source).tolist())

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    for _ in range(200):  # at most 10 s
        if assignment.waiting_ahead:
            break
        producer.join(0.05)
    assert assignment.waiting_ahead == 2  # took 0 and 1, waits for a third to yield 0
    assert woken == [True]
    assignment.extend(1, [2])
    producer.join(10)
    assert got == client_sequence(ids_fn, 1, num_workers=0)
    assert assignment.waiting_ahead == 0
    assert assignment.pop_taken() == 0


# ---------------------------------------------------------------------------------------------
# On Ray: the stream with torch DataLoader worker processes in every input worker
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("C,W", [(1, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("options,ahead", [
    ({}, 4),
    ({"persistent_workers": True, "prefetch_factor": 4, "pin_memory": True}, 8),
], ids=["num_workers=2", "persistent+prefetch4+pin"])
def test_a_dataloader_with_worker_processes_streams_and_resumes_exactly(ray_session, C, W,
                                                                        options, ahead):
    first_steps, rest = 8, 6  # each part crosses an epoch boundary; the resume is mid-epoch
    loader = DataLoader(ids_fn, num_workers=2, **options)
    cfg = CSConfig(num_csx=C, num_workers_per_csx=W, straggler_timeout_s=30.0)
    first, second, stats = run_and_resume(cfg, f"pf{C}x{W}{len(options)}", loader,
                                          first_steps, rest)
    expected = client_sequence(ids_fn, first_steps + rest, num_workers=0)
    assert first == expected[:first_steps]
    assert second == expected[first_steps:]
    assert_exactly_once_per_epoch(first + second)
    assert {a["mode"] for a in stats} == {"dynamic"}
    assert all(a["draws_ahead"] == [ahead] * W for a in stats)


def test_a_user_read_ahead_wrapper_is_granted_what_it_draws_ahead(ray_session):
    loader = DataLoader(ids_fn, num_workers=0, read_ahead=3)
    cfg = CSConfig(num_workers_per_csx=2, straggler_timeout_s=30.0)
    # one number a worker: the wrapper, which yields a batch once it drew 3 more, waits with
    # 1, then 2, then 3 drawn; each time the worker reports it and is granted one more
    first, second, stats = run_and_resume(cfg, "pfwrap", loader, 7, 6,
                                          assigned_batches_per_worker=1)
    expected = client_sequence(ids_fn, 13, num_workers=0)
    assert first + second == expected
    assert_exactly_once_per_epoch(first + second)
    assert {a["mode"] for a in stats} == {"dynamic"}
    # learnt from the workers (the loader itself draws nothing ahead): 3 by a worker given at
    # least 3 batches of an epoch (one of the two is); a worker whose next number falls in
    # the next epoch has its sampler end there and the wrapper yield what it holds
    assert [max(a["draws_ahead"]) for a in stats] == [3, 3]


def test_a_loader_yielding_out_of_order_falls_back_to_static_and_says_why(ray_session):
    loader = DataLoader(ids_fn, num_workers=2, in_order=False)
    streams = open_streams(CSConfig(num_workers_per_csx=2), "pfstatic", loader)
    try:
        got, _ = read_steps(streams, 4)
        a = streams[0].stats()["assignment"]
    finally:
        streams[0].close()
    assert len(got) == 4
    assert (a["requested"], a["mode"]) == ("dynamic", "static")
    assert "in_order=False" in a["reason"]


# ---------------------------------------------------------------------------------------------
# Through the executor: the run that used to sit at 0 steps, resumed from a checkpoint
# ---------------------------------------------------------------------------------------------

def run_executor(cfg, steps, resume=None, checkpoint_at=None):
    run = record_run("CSX", ids_fn, steps, cfg, resume=resume, checkpoint_steps=checkpoint_at,
                     value=whole_batch, per_step=True, loader_options={"num_workers": 2})
    return run.seen, run.states, run.executor.report


def test_the_wafer_runs_a_dataloader_with_worker_processes_and_resumes_from_a_checkpoint(
        ray_session):
    cfg = CSConfig(num_workers_per_csx=2, straggler_timeout_s=30.0)
    seen, saved, report = run_executor(cfg, 8, checkpoint_at=5)
    expected = client_sequence(ids_fn, 14, num_workers=0)
    assert seen == expected[:8]
    a = report["input_assignment"]
    assert (a["requested"], a["mode"]) == ("dynamic", "dynamic")
    assert [w["draws_ahead"] for w in a["workers"]] == [4, 4]
    from executor.report_text import format_summary

    assert format_summary(report).count("loader draws 4 ahead") == 2
    rest, _, _ = run_executor(cfg, 9, resume=saved[4])
    assert seen[:5] + rest == expected
