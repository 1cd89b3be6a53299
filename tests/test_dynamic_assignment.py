"""Dynamic assignment of global batches to input workers: exactly once, in exact order.

Workers take global batch numbers as they become free and the stream puts the batches back
into order (workers/coordinator.py). The tests assert on the sequence of global batches itself,
as tests/test_sharding.py does: first with workers simulated in-process and numbers handed out
in an arbitrary order, then on Ray (the stream a run opens), across a killed worker and a
resume with another worker count.
"""

from __future__ import annotations

import os
import random
import re
from collections import Counter

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler

from workers import CSConfig, sharding
from workers.context import BatchAssignment, WorkerInfo, batch_assignment, worker_context
from workers.assignment import cost_summary
from workers.dataloader import DataLoader
from workers.flow import FlowPolicy
from workers.resume import ResumeStates
from workers.resume import Source
from workers.loaders import dynamic_assignment_support
from workers.sharding import ShardedSampler
from workers.stream import configured_stream

from helpers.runs import record_run, whole_batch
from helpers.streams import client_sequence, close_all, open_streams, read_steps

from test_sharding import TOPOLOGIES


def shuffled_ids_fn(n=24, batch_size=4, marker=None, release_ids=()):
    """Global batches of sample ids (6 an epoch with the defaults), reshuffled every epoch by
    the sampler's own seeded generator, each worker producing the ones it is given.

    ``marker``: worker 0's first batch waits (up to a minute) until that file exists, which
    another worker creates when it reads a sample of ``release_ids``."""
    import time as _time

    from workers import get_worker_info

    ids = torch.arange(1000, 1000 + n)
    w = get_worker_info().local_worker_id
    state = {"first": True}

    class Ids(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            if marker is not None and w == 0 and state["first"]:
                deadline = _time.time() + 60
                while not os.path.exists(marker) and _time.time() < deadline:
                    _time.sleep(0.01)
                state["first"] = False
            if marker is not None and w != 0 and int(ids[i]) in release_ids:
                open(marker, "a").close()
            return ids[i]

    order = RandomSampler(range(n), generator=torch.Generator().manual_seed(11))
    batches = BatchSampler(order, batch_size=batch_size, drop_last=True)
    return torch.utils.data.DataLoader(Ids(), batch_sampler=ShardedSampler(batches))


def open_id_streams(cfg, prefix, loader=None):
    """One stream per CS-X of :func:`shuffled_ids_fn` (or ``loader``)."""
    return open_streams(cfg, prefix, loader or DataLoader(shuffled_ids_fn))


# ---------------------------------------------------------------------------------------------
# ShardedSampler under dynamic assignment, workers simulated in-process
# ---------------------------------------------------------------------------------------------

def assign_in_any_order(C, W, steps, seed):
    """Numbers 0..steps-1 dealt to the workers of each CS-X in a seeded random pattern (each
    worker's own numbers increasing, as a coordinator issues them); returns, per CS-X, the
    batch each number produced."""
    rng = random.Random(seed)
    by_csx = []
    for c in range(C):
        owner = [rng.randrange(W) for _ in range(steps)]
        produced = {}
        for w in range(W):
            mine = [s for s in range(steps) if owner[s] == w]
            info = WorkerInfo(local_worker_id=w, num_workers_per_csx=W, num_csx=C, wse_id=c)
            assignment = BatchAssignment()
            assignment.extend(0, mine)
            loader = DataLoader(shuffled_ids_fn)
            with worker_context(info), batch_assignment(assignment):
                source = Source(loader, loader.build(info))
                for s in mine:
                    produced[s] = next(source).tolist()
                    assert assignment.pop_taken() == s
        by_csx.append(produced)
    return by_csx


@pytest.mark.parametrize("C,W", TOPOLOGIES)
def test_any_assignment_of_numbers_to_workers_reassembles_the_global_sequence(C, W):
    steps = 18  # three epochs of 6 global batches
    expected = client_sequence(shuffled_ids_fn, steps)
    for seed in (0, 1):
        by_csx = assign_in_any_order(C, W, steps, seed)
        got = [[i for c in range(C) for i in by_csx[c][s]] for s in range(steps)]
        assert got == expected
        for e in range(3):  # every sample once per epoch
            assert Counter(i for b in got[6 * e:6 * e + 6] for i in b) == Counter(range(1000, 1024))


def test_a_worker_given_no_batch_of_an_epoch_still_draws_the_next_epochs_shuffle():
    expected = client_sequence(shuffled_ids_fn, 18)
    info = WorkerInfo(local_worker_id=1, num_workers_per_csx=3)
    assignment = BatchAssignment()
    assignment.extend(1, [16, 17])  # sends applied in order: 0 first
    assignment.extend(0, [2])
    loader = DataLoader(shuffled_ids_fn)
    with worker_context(info), batch_assignment(assignment):
        source = Source(loader, loader.build(info))
        got = [next(source).tolist() for _ in range(3)]  # epoch 1 skipped entirely
    assert got == [expected[2], expected[16], expected[17]]


def test_a_number_the_worker_walked_past_is_made_from_what_it_kept():
    # a dead worker's numbers go to live workers that may have passed them already
    assignment = BatchAssignment()
    assignment.extend(0, [3, 1, 4, 0])
    sampler = ShardedSampler(BatchSampler(range(12), 2, drop_last=True))
    with batch_assignment(assignment):
        it = iter(sampler)
        assert [next(it) for _ in range(4)] == [[6, 7], [2, 3], [8, 9], [0, 1]]
        assert sampler.state_dict()["next_global_batch"] == 1  # the position after batch 0


def test_a_number_behind_what_the_worker_kept_is_refused_not_streamed(monkeypatch):
    monkeypatch.setattr(sharding, "PASSED_BATCHES", 1)  # it keeps batch 2 only
    assignment = BatchAssignment()
    assignment.extend(0, [3, 1])
    sampler = ShardedSampler(BatchSampler(range(12), 2, drop_last=True))
    with batch_assignment(assignment):
        it = iter(sampler)
        assert next(it) == [6, 7]
        with pytest.raises(RuntimeError, match="global batch number 1 .* was assigned after "
                                               "this worker had passed it"):
            next(it)


def test_which_loaders_can_be_assigned_dynamically():
    ok, why = dynamic_assignment_support(shuffled_ids_fn())
    assert ok and "ShardedSampler" in why
    ok, why = dynamic_assignment_support([torch.zeros(2)] * 3)
    assert not ok and "does not draw its batches from a cstream ShardedSampler" in why

    class NoLen:
        def __iter__(self):
            return iter([[0, 1]])

    ok, why = dynamic_assignment_support(
        torch.utils.data.DataLoader(range(4), batch_sampler=ShardedSampler(NoLen())))
    assert not ok and "has no len()" in why


def test_cost_summary_percentiles():
    s = cost_summary([float(i) for i in range(1, 101)])
    assert (s["count"], s["p50_s"], s["p99_s"], s["max_s"]) == (100, 51.0, 99.0, 100.0)
    assert cost_summary([]) is None


def test_input_assignment_is_checked_with_the_rule():
    with pytest.raises(ValueError, match=r"CSConfig.input_assignment: expected one of "
                                         r"\('dynamic', 'static'\), got 'balanced'"):
        CSConfig(input_assignment="balanced")


# ---------------------------------------------------------------------------------------------
# On Ray: the stream reorders what the workers produce
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("C,W", [(1, 4), (2, 2), (1, 8)])
def test_dynamic_stream_delivers_the_single_process_sequence(ray_session, C, W):
    steps = 20  # more than three epochs
    expected = client_sequence(shuffled_ids_fn, steps)
    streams = open_id_streams(CSConfig(num_csx=C, num_workers_per_csx=W), f"dyn{C}x{W}")
    try:
        got, _ = read_steps(streams, steps)
        stats = [s.stats() for s in streams]
    finally:
        close_all(streams)
    assert got == expected
    assert {st["assignment"]["mode"] for st in stats} == {"dynamic"}
    for st in stats:
        assert sum(w["batches"] for w in st["workers"]) == steps
        assert st["reorder_window"]["max_batches"] <= st["reorder_window"]["capacity_batches"]


def test_a_slow_batch_holds_back_only_its_own_worker(ray_session, tmp_path):
    # worker 0 is stuck on its first batch (step 0; it holds step 4 behind it with 2 numbers a
    # worker) until another worker has produced step 28: the others go on meanwhile
    expected = client_sequence(shuffled_ids_fn, 40, n=200)  # one epoch: each id in one batch only
    release = 28
    loader = DataLoader(shuffled_ids_fn, n=200, marker=str(tmp_path / "go"),
                        release_ids=tuple(expected[release]))
    streams = open_id_streams(CSConfig(num_workers_per_csx=4), "slowbatch", loader)
    try:
        assert streams[0].assignment.window_batches > release
        got, workers = read_steps(streams, 40)
    finally:
        close_all(streams)
    assert got == expected
    producer = [w[0] for w in workers]
    held = streams[0].assignment.book.assigned_per_worker
    assert [s for s in range(release + 1) if producer[s] == 0] == [4 * i for i in range(held)]


def large_batches_fn():
    """Global batches of one 128 KiB sample each (a reply carries a few, not many)."""
    class Large(torch.utils.data.Dataset):
        def __len__(self):
            return 1000

        def __getitem__(self, i):
            return torch.full((32 * 1024,), float(i))

    batches = BatchSampler(torch.utils.data.SequentialSampler(range(1000)), 1, drop_last=True)
    return torch.utils.data.DataLoader(Large(), batch_sampler=ShardedSampler(batches))


def test_the_workers_fill_the_whole_reorder_window_while_the_wafer_waits(ray_session):
    # the workers run ahead as far as the window allows, whatever share of it each one holds:
    # the lead a slow batch needs is the window, not a few batches a worker
    import time as _time

    stream = configured_stream(DataLoader(large_batches_fn), CSConfig(num_workers_per_csx=2),
                                    0, name_prefix="fillwin",
                                    policy=FlowPolicy(reorder_window_batches_per_worker=12))
    try:
        deadline = _time.monotonic() + 60
        while stream.ready_count() < 24 and _time.monotonic() < deadline:
            _time.sleep(0.05)
        assert stream.ready_count() == 24  # numbers 0-23: the window's bound, and no more
        got = [int(stream.next()[0][0, 0]) for _ in range(30)]
    finally:
        stream.close()
    assert got == list(range(30))


def test_input_faster_than_the_wafer_goes_several_batches_to_a_reply(ray_session):
    # the usual case in training: the window is full nearly always, and it is refilled in
    # chunks, not one number (one assign call, one reply) per step
    import time as _time

    stream = configured_stream(DataLoader(large_batches_fn), CSConfig(num_workers_per_csx=2),
                                    0, name_prefix="refill",
                                    policy=FlowPolicy(reorder_window_batches_per_worker=32))
    try:
        got = []
        for _ in range(300):
            got.append(int(stream.next()[0][0, 0]))
            _time.sleep(0.002)  # a wafer step
        stats = stream.stats()
    finally:
        stream.close()
    assert got == list(range(300))
    batches = sum(w["batches"] for w in stats["workers"])
    replies = sum(w["replies"] for w in stats["workers"])
    assert replies <= 0.75 * batches, (replies, batches)
    assert min(w["batches"] for w in stats["workers"]) >= 0.25 * batches  # both take part


def test_a_killed_worker_is_replaced_without_losing_or_repeating_a_batch(ray_session):
    cfg = CSConfig(num_workers_per_csx=4, max_worker_restarts=2)
    streams = open_id_streams(cfg, "dynkill")
    try:
        got, _ = read_steps(streams, 5)
        ray_session.kill(ray_session.get_actor("dynkill-csx0-w1"))
        # the workers may have made every batch of the reorder window before the kill: read
        # past it, so that numbers are handed out after the kill, the idle dead worker's first
        after = streams[0].assignment.window_batches + 8
        more, _ = read_steps(streams, after)
        stats = streams[0].stats()
    finally:
        close_all(streams)
    assert got + more == client_sequence(shuffled_ids_fn, 5 + after)
    assert [w["restarts"] for w in stats["workers"]] == [0, 1, 0, 0]


@pytest.mark.parametrize("old,new,modes", [((1, 4), (1, 3), ("dynamic", "dynamic")),
                                           ((2, 2), (1, 1), ("dynamic", "static")),
                                           ((1, 2), (2, 2), ("static", "dynamic"))])
def test_a_resume_with_another_worker_count_continues_the_sequence_exactly(ray_session, old,
                                                                            new, modes):
    first_steps, rest = 9, 10  # the resume lands mid-epoch (epochs are 6 global batches)
    cfg = CSConfig(num_csx=old[0], num_workers_per_csx=old[1], input_assignment=modes[0])
    streams = open_id_streams(cfg, "resume-a")
    try:
        first, _ = read_steps(streams, first_steps)
        states = [st for s in streams for st in s.worker_states()]
    finally:
        close_all(streams)
    cfg2 = CSConfig(num_csx=new[0], num_workers_per_csx=new[1], input_assignment=modes[1])
    states = ResumeStates(states).remap(cfg2.num_csx, cfg2.num_workers_per_csx)
    streams = open_streams(cfg2, "resume-b", DataLoader(shuffled_ids_fn), resume=states)
    try:
        second, _ = read_steps(streams, rest)
        mode = streams[0].stats()["assignment"]["mode"]
    finally:
        close_all(streams)
    assert mode == modes[1]
    assert first + second == client_sequence(shuffled_ids_fn, first_steps + rest)


def ids_without_sampler(n=8):
    from workers import get_worker_info

    info = get_worker_info()
    return [torch.tensor([i]) for i in range(n)][info.local_worker_id::info.num_workers_per_csx]


def test_a_loader_that_cannot_take_part_keeps_round_robin_and_says_why(ray_session):
    streams = open_id_streams(CSConfig(num_workers_per_csx=2), "dynstatic",
                              DataLoader(ids_without_sampler))
    try:
        got = [streams[0].next()[0].tolist() for _ in range(6)]
        stats = streams[0].stats()
    finally:
        close_all(streams)
    assert got == [[0], [1], [2], [3], [4], [5]]
    assert stats["assignment"]["requested"] == "dynamic"
    assert stats["assignment"]["mode"] == "static"
    assert "does not draw its batches from a cstream ShardedSampler" in \
        stats["assignment"]["reason"]
    assert "reorder_window" not in stats


# ---------------------------------------------------------------------------------------------
# Through the executor: the wafer's sequence, and what the profile says
# ---------------------------------------------------------------------------------------------

def run_ids(cfg, steps):
    run = record_run("CSX", shuffled_ids_fn, steps, cfg, value=whole_batch, per_step=True)
    return run.seen, run.executor.report


def test_the_wafer_sees_the_single_process_sequence_and_the_report_says_dynamic(ray_session):
    from executor.report_text import format_summary

    seen, report = run_ids(CSConfig(num_csx=2, num_workers_per_csx=2), 14)
    assert seen == client_sequence(shuffled_ids_fn, 14)
    a = report["input_assignment"]
    assert (a["requested"], a["mode"]) == ("dynamic", "dynamic")
    assert a["reorder_window"]["max_batches"] <= a["reorder_window"]["capacity_batches"]
    assert sorted((w["csx"], w["worker"]) for w in a["workers"]) == [(0, 0), (0, 1), (1, 0),
                                                                     (1, 1)]
    assert sum(w["batch_costs"] for w in a["workers"] if w["csx"] == 0) >= 14
    text = format_summary(report)
    assert re.search(r"^input assignment +dynamic \(the loader draws its global batches from a "
                     r"ShardedSampler\)$", text, re.M)
    assert "batch cost" in text and "p99" in text
    assert all(w["waiting_for_numbers_s"] >= 0 for w in a["workers"])
    assert text.count("waited for numbers") == 4


def stream_report(mode, waits, worker_waits, window=None):
    workers = [{"local_worker_id": w, "batches": 10, "straggler_wait_s": s,
                "batch_cost": cost_summary([0.01] * 9 + [0.1 * (w + 1)])}
               for w, s in enumerate(worker_waits)]
    out = {"wse_id": 0, "assignment": {"requested": "dynamic", "mode": mode, "reason": "why"},
           "straggler_wait_s": waits, "workers": workers}
    if window:
        out["reorder_window"] = window
    return out


def test_the_report_names_the_straggler_that_cost_utilisation():
    from executor.report import input_assignment

    # the wafer waited 1 s of 10; 0.8 s of the streams' waiting was for worker 2's batches
    a = input_assignment([stream_report("static", 0.9, [0.0, 0.1, 0.8])], 1.0, 10.0)
    assert a["stragglers_cost_utilisation"] is True
    assert a["straggler_worker"] == {"csx": 0, "worker": 2}
    assert "CS-X 0 worker 2" in a["verdict"] and "input_assignment='dynamic'" in a["verdict"]
    assert [w["batch_cost_p99_s"] for w in a["workers"]] == [0.1, 0.2, 0.1 * 3]
    assert a["reorder_window"] is None

    # waiting, but not for a straggler: the input side is slow as a whole
    a = input_assignment([stream_report("dynamic", 0.1, [0.05, 0.05, 0.0],
                                        {"mean_batches": 2.0, "max_batches": 5,
                                         "capacity_batches": 24})], 1.0, 10.0)
    assert a["stragglers_cost_utilisation"] is False and a["straggler_worker"] is None
    assert "the input side as a whole is slower" in a["verdict"]
    assert a["reorder_window"] == {"mean_batches": 2.0, "max_batches": 5, "capacity_batches": 24}

    # hardly any input wait: stragglers cost nothing whatever the streams waited
    a = input_assignment([stream_report("static", 0.5, [0.5, 0.0, 0.0])], 0.1, 10.0)
    assert a["stragglers_cost_utilisation"] is False
