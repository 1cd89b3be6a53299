"""Adding and retiring input workers of a running stream: the wafer's sequence of global
batches stays exactly the one of a stream with a fixed number of workers, under dynamic
assignment (workers join and leave between numbers) and under round-robin (the workers are
re-formed at a step boundary from the exact position); a loader whose position cannot be
re-formed exactly is refused up front, saying why."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler

from workers import CSConfig
from workers.dataloader import DataLoader
from workers.flow import FlowPolicy
from workers.parquet import ParquetDataset
from workers.sharding import DistributedSampler, ShardedSampler, shard_iterable
from workers.stream import configured_stream

from helpers.streams import SampleIds, client_sequence, read_steps

N, BATCH = 24, 2  # 12 global batches an epoch: the changes fall in an epoch and across one


def ids_fn(num_workers=0):
    """Global batches of sample ids from a ShardedSampler, reshuffled every epoch by its own
    seeded generator; ``num_workers``: read by a torch DataLoader with worker processes."""
    order = RandomSampler(range(N), generator=torch.Generator().manual_seed(5))
    sampler = ShardedSampler(BatchSampler(order, batch_size=BATCH, drop_last=True))
    options = dict(num_workers=num_workers, multiprocessing_context="fork") if num_workers \
        else {}
    return torch.utils.data.DataLoader(SampleIds(N), batch_sampler=sampler, **options)


def parquet_fn(paths):
    return ParquetDataset(paths, columns=["x"], batch_size=BATCH)


def rows(batch):
    return batch["x"].tolist()


@pytest.fixture
def parquet_paths(tmp_path):
    """Rows 0..19 in two files, 10 global batches an epoch."""
    paths = []
    for k, (lo, hi) in enumerate([(0, 11), (11, 20)]):
        path = tmp_path / f"part{k}.parquet"
        pq.write_table(pa.table({"x": pa.array(range(lo, hi), pa.int64())}), path,
                       row_group_size=4)
        paths.append(str(path))
    return paths


def open_stream(mode, prefix, loader, W=2):
    cfg = CSConfig(num_workers_per_csx=W, input_assignment=mode)
    # a small reorder window: a retired worker's batches made ahead are delivered within
    # a few steps of its retirement
    policy = FlowPolicy.from_config(cfg, assigned_batches_per_worker=2, small_reply_batches=1,
                                    reorder_window_batches_per_worker=2)
    return configured_stream(loader, cfg, 0, policy=policy, name_prefix=prefix)


def wait_started(stream, timeout_s=120.0):
    """Wait until every worker taking part has a process that answered (an added worker's
    starts in seconds, while a stream of cheap batches takes hundreds of steps)."""
    for w in stream.active_workers():
        link = stream.workers[w]
        if link.where_ref is not None:
            link.node_of(timeout_s)


def change_and_read(stream, ids):
    """5 steps on 2 workers; add one, 9 steps; retire worker 0, 10 steps; add two and retire
    worker 1, 6 steps. Returns the steps, the workers of each part, and the workers taking
    part after each change."""
    seq, workers = read_steps([stream], 5, ids)
    taking_part = []
    for change, steps in ((lambda: stream.add_workers(1), 9),
                          (lambda: stream.retire_workers([0]), 10),
                          (lambda: stream.change_workers(add=2, retire=[1]), 6)):
        taking_part.append(change())
        wait_started(stream)
        got, who = read_steps([stream], steps, ids)
        seq += got
        workers += who
    return seq, workers, taking_part


LOADERS = {
    "sharded_sampler": (lambda paths: DataLoader(ids_fn), lambda b: b.tolist(),
                        lambda paths, steps: client_sequence(ids_fn, steps)),
    "parquet": (lambda paths: DataLoader(parquet_fn, paths), rows,
                lambda paths, steps: client_sequence(parquet_fn, steps, rows, paths=paths)),
}


@pytest.mark.timeout(900)  # four start-ups of new workers on a loaded machine
@pytest.mark.parametrize("loader_kind", sorted(LOADERS))
def test_workers_added_and_retired_under_round_robin_keep_the_sequence(
        ray_session, parquet_paths, loader_kind):
    make, ids, expected = LOADERS[loader_kind]
    with open_stream("static", f"chg-rr-{loader_kind}", make(parquet_paths)) as stream:
        assert stream.can_change_workers()[0]
        seq, workers, taking_part = change_and_read(stream, ids)
        stats = stream.stats()
    assert seq == expected(parquet_paths, 30)
    # re-formed at each boundary: 3 workers, then 2, then 3, each taking its turn
    assert taking_part == [[0, 1, 2], [0, 1], [0, 1, 2]]
    assert [w for (w,) in workers] == [0, 1, 0, 1, 0] + [s % 3 for s in range(5, 14)] + \
        [s % 2 for s in range(14, 24)] + [s % 3 for s in range(24, 30)]
    assert stats["assignment"]["mode"] == "static"
    assert stats["batches"] == 30  # the re-formed workers' deliveries are counted once


@pytest.mark.timeout(900)  # four start-ups of new workers on a loaded machine
@pytest.mark.parametrize("loader_kind", sorted(LOADERS))
def test_workers_added_and_retired_under_dynamic_assignment_keep_the_sequence(
        ray_session, parquet_paths, loader_kind):
    make, ids, expected = LOADERS[loader_kind]
    with open_stream("dynamic", f"chg-dyn-{loader_kind}", make(parquet_paths)) as stream:
        assert stream.can_change_workers() == (
            True, "dynamic assignment takes in and lets go of workers at any step")
        seq, workers, taking_part = change_and_read(stream, ids)
        more, later = read_steps([stream], 30, ids)
        stats = stream.stats()
    assert seq + more == expected(parquet_paths, 60)
    assert taking_part == [[0, 1, 2], [1, 2], [2, 3, 4]]  # ids are never reused
    assert stats["assignment"]["mode"] == "dynamic"
    changes = stats["worker_changes"]
    assert [(c["added"], c["step"]) for c in changes if "added" in c] == [(2, 5), (3, 24),
                                                                          (4, 24)]
    # a retired worker leaves once the numbers it owes are handed back or made
    assert sorted(c["retired"] for c in changes if "retired" in c) == [0, 1]
    assert all(c["step"] >= {0: 14, 1: 24}[c["retired"]] for c in changes if "retired" in c)
    assert [link.retired for link in stream.workers] == [True, True, False, False, False]
    # every added worker took part; the retired ones delivered only what they had made
    assert {w for (w,) in later[10:]} == {2, 3, 4}, later
    assert {w for (w,) in workers[5:]} >= {2}


@pytest.mark.timeout(900)  # four start-ups of new workers on a loaded machine
@pytest.mark.slow  # ~4 minutes here: every re-forming forks the loader's processes again
def test_workers_added_and_retired_from_a_dataloader_with_worker_processes_keep_the_sequence(
        ray_session):
    loader = DataLoader(ids_fn, num_workers=2)
    for mode in ("static", "dynamic"):
        with open_stream(mode, f"chg-procs-{mode}", loader) as stream:
            assert stream.can_change_workers()[0], stream.can_change_workers()
            seq, _, _ = change_and_read(stream, lambda b: b.tolist())
        assert seq == client_sequence(ids_fn, 30), mode


def distributed_fn():
    return torch.utils.data.DataLoader(list(range(1000, 1000 + N)), batch_size=BATCH,
                                       sampler=DistributedSampler(range(N)))


def iterable_fn():
    return shard_iterable([torch.tensor([i]) for i in range(N)])


@pytest.mark.timeout(600)  # one stream's start-up on a loaded machine
@pytest.mark.parametrize("input_fn,kind", [(distributed_fn, "DataLoader"),
                                           (iterable_fn, "_ShardedIterable")])
def test_a_round_robin_loader_that_keeps_a_per_shard_position_is_refused_up_front(
        ray_session, input_fn, kind):
    with open_stream("static", f"chg-refuse-{kind}", DataLoader(input_fn)) as stream:
        ok, why = stream.can_change_workers()
        assert not ok
        assert why.startswith(f"the loader input_fn returned ({kind}) keeps a position of its "
                              "own shard")
        before, _ = read_steps([stream], 3)
        with pytest.raises(ValueError, match=r"CS-X 0: the input workers of this stream "
                           r"cannot be changed while it runs: the loader input_fn returned"):
            stream.add_workers(1)
        after, workers = read_steps([stream], 3)  # the refused change changed nothing
    assert [w for (w,) in workers] == [1, 0, 1]
    assert len(before + after) == 6


@pytest.mark.timeout(600)  # one stream's start-up on a loaded machine
def test_a_change_that_would_leave_no_worker_or_names_a_stranger_is_refused(ray_session):
    with open_stream("dynamic", "chg-bad", DataLoader(ids_fn)) as stream:
        with pytest.raises(ValueError, match=r"retiring 2 of the 2 input workers taking part "
                           r"\(adding 0\) would leave none; keep at least one"):
            stream.retire_workers([0, 1])
        with pytest.raises(ValueError, match=r"cannot retire input worker\(s\) \[5\]: the "
                           r"workers taking part are \[0, 1\]; name each one once"):
            stream.retire_workers([5])
        assert stream.active_workers() == [0, 1]


def test_an_in_process_stream_says_it_cannot_change_its_workers():
    from workers.local_stream import LocalInputStream

    stream = LocalInputStream(DataLoader(ids_fn), CSConfig(num_workers_per_csx=2), 0)
    assert stream.can_change_workers() == (
        False, "the stream runs its workers in this process, one after another "
        "(in_process=True): run the input workers on Ray to change them")
    assert stream.active_workers() == [0, 1]
