"""Data-sharding schemes: each simulated input worker gets exactly its shard of the data.

Workers are simulated in-process with ``worker_context(WorkerInfo(...))``; no Ray is needed.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

import cstream as cstorch
from workers.context import WorkerInfo, worker_context
from workers.parquet import ParquetDataset
from workers.sharding import DistributedSampler, ShardedSampler, shard_iterable

# (num_csx, num_workers_per_csx): 1, 2, 3, 4 and 8 workers in all
TOPOLOGIES = [(1, 1), (1, 2), (2, 1), (3, 1), (1, 4), (2, 2), (1, 8), (2, 4)]


def infos(C, W):
    """Every worker of a cluster, CS-X by CS-X."""
    return [WorkerInfo(local_worker_id=w, num_workers_per_csx=W, num_csx=C, wse_id=c)
            for c in range(C) for w in range(W)]


def per_worker(make, C, W):
    """``{(wse_id, local_worker_id): list(make())}``, each built and iterated as that worker."""
    out = {}
    for info in infos(C, W):
        with worker_context(info):
            out[(info.wse_id, info.local_worker_id)] = [list(b) for b in make()]
    return out


def reassemble(shards, C, W, steps=None):
    """The wafer's view: step s reads worker s % W of every CS-X and concatenates the slices."""
    pos = {k: 0 for k in shards}
    out, s = [], 0
    while steps is None or s < steps:
        w = s % W
        if pos[(0, w)] >= len(shards[(0, w)]):
            break
        batch = []
        for c in range(C):
            batch += shards[(c, w)][pos[(c, w)]]
            pos[(c, w)] += 1
        out.append(batch)
        s += 1
    assert all(pos[k] == len(v) for k, v in shards.items()) or steps is not None
    return out


def shuffled_batches(n=40, batch_size=6, seed=3):
    order = RandomSampler(range(n), generator=torch.Generator().manual_seed(seed))
    return BatchSampler(order, batch_size=batch_size, drop_last=True)


# ---------------------------------------------------------------------------------------------
# ShardedSampler
# ---------------------------------------------------------------------------------------------

def sequential(n, batch_size, drop_last=False):
    return BatchSampler(SequentialSampler(range(n)), batch_size=batch_size, drop_last=drop_last)


def test_sharded_sampler_one_csx_two_workers_alternate_whole_batches():
    shards = per_worker(lambda: ShardedSampler(sequential(18, 3)), C=1, W=2)
    assert shards == {
        (0, 0): [[0, 1, 2], [6, 7, 8], [12, 13, 14]],
        (0, 1): [[3, 4, 5], [9, 10, 11], [15, 16, 17]],
    }


def test_sharded_sampler_two_csx_two_workers_split_each_batch_first_slice_larger():
    shards = per_worker(lambda: ShardedSampler(sequential(20, 5)), C=2, W=2)
    assert shards == {
        (0, 0): [[0, 1, 2], [10, 11, 12]],
        (0, 1): [[5, 6, 7], [15, 16, 17]],
        (1, 0): [[3, 4], [13, 14]],
        (1, 1): [[8, 9], [18, 19]],
    }


def test_sharded_sampler_three_csx_slices_like_tensor_split():
    shards = per_worker(lambda: ShardedSampler(sequential(12, 4)), C=3, W=1)
    assert shards == {
        (0, 0): [[0, 1], [4, 5], [8, 9]],
        (1, 0): [[2], [6], [10]],
        (2, 0): [[3], [7], [11]],
    }
    expected = [[t.tolist() for t in torch.arange(4 * i, 4 * i + 4).tensor_split(3)] for i in range(3)]
    assert [[shards[(c, 0)][i] for c in range(3)] for i in range(3)] == expected


def test_sharded_sampler_one_csx_four_workers_take_every_fourth_batch():
    shards = per_worker(lambda: ShardedSampler(sequential(14, 2)), C=1, W=4)
    assert shards == {
        (0, 0): [[0, 1], [8, 9]],
        (0, 1): [[2, 3], [10, 11]],
        (0, 2): [[4, 5], [12, 13]],
        (0, 3): [[6, 7]],
    }


def test_sharded_sampler_client_yields_the_global_batches_unchanged():
    batches = [[5, 1], (2, 7, 3), torch.tensor([4, 0])]
    assert list(ShardedSampler(batches)) == batches
    out = list(ShardedSampler(batches))
    assert all(a is b for a, b in zip(out, batches))


@pytest.mark.parametrize("C,W", TOPOLOGIES)
def test_sharded_sampler_round_robin_reassembles_the_global_batch_sequence(C, W):
    expected = [list(b) for b in shuffled_batches()]
    shards = per_worker(lambda: ShardedSampler(shuffled_batches()), C, W)
    assert reassemble(shards, C, W) == expected
    seen = Counter(i for batches in shards.values() for b in batches for i in b)
    assert seen == Counter(i for b in expected for i in b)  # every sample of the epoch once
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("C,W", TOPOLOGIES)
def test_sharded_sampler_len_is_the_number_of_batches_each_worker_yields(C, W):
    for info in infos(C, W):
        with worker_context(info):
            sampler = ShardedSampler(sequential(35, 3, drop_last=True))  # 11 global batches
            assert len(sampler) == len(list(sampler))
    assert len(ShardedSampler(sequential(35, 3, drop_last=True))) == 11


def test_sharded_sampler_reads_the_worker_when_iterated_not_when_built():
    sampler = ShardedSampler(sequential(8, 2))
    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2)):
        assert [list(b) for b in sampler] == [[2, 3], [6, 7]]
        built_inside = ShardedSampler(sequential(8, 2))
    assert [list(b) for b in built_inside] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_sharded_sampler_in_a_torch_dataloader_yields_the_workers_rows():
    data = torch.arange(100, 112)

    def input_fn():
        return torch.utils.data.DataLoader(data, batch_sampler=ShardedSampler(sequential(12, 4)))

    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2, num_csx=2, wse_id=1)):
        assert [b.tolist() for b in input_fn()] == [[106, 107]]
    assert [b.tolist() for b in input_fn()] == [[100, 101, 102, 103], [104, 105, 106, 107],
                                                [108, 109, 110, 111]]


def test_sharded_sampler_batch_smaller_than_num_csx_is_an_error_naming_the_batch():
    sampler = ShardedSampler(sequential(7, 3))  # batches of 3, 3, 1
    with worker_context(WorkerInfo(num_csx=2, wse_id=1)):
        it = iter(sampler)
        assert list(next(it)) == [2]
        assert list(next(it)) == [5]
        with pytest.raises(ValueError) as e:
            next(it)
    assert str(e.value) == (
        "ShardedSampler: global batch 2 has 1 sample(s), fewer than num_csx=2, so some CS-X "
        "would get an empty slice of it. Every global batch needs at least num_csx samples: use a "
        "batch_size of at least 2, and drop_last=True in the BatchSampler when the short last "
        "batch is the cause."
    )


def test_sharded_sampler_set_epoch_reaches_the_batch_samplers_sampler():
    def make():
        inner = torch.utils.data.DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True,
                                                    seed=5)
        return ShardedSampler(BatchSampler(inner, 3, drop_last=False)), inner

    sampler, inner = make()
    epoch0 = [list(b) for b in sampler]
    sampler.set_epoch(4)
    assert inner.epoch == 4 and sampler.epoch == 4
    epoch4 = [list(b) for b in sampler]
    ref = torch.utils.data.DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=5)
    ref.set_epoch(4)
    assert epoch4 == [list(b) for b in BatchSampler(ref, 3, drop_last=False)]
    assert epoch4 != epoch0


def test_sharded_sampler_set_epoch_reaches_a_data_source_that_has_it():
    class Source:
        epoch = 0

        def set_epoch(self, e):
            self.epoch = e

        def __iter__(self):
            return iter([[self.epoch, self.epoch + 1]])

    sampler = ShardedSampler(Source())
    sampler.set_epoch(7)
    assert list(sampler) == [[7, 8]]


def _samplers(C, W):
    out = {}
    for info in infos(C, W):
        with worker_context(info):
            out[(info.wse_id, info.local_worker_id)] = ShardedSampler(shuffled_batches(n=60, batch_size=4))
    return out


@pytest.mark.parametrize("C,W", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_sharded_sampler_resumes_mid_epoch_from_each_workers_own_state(C, W):
    expected = [list(b) for b in shuffled_batches(n=60, batch_size=4)]  # 15 global batches
    samplers = _samplers(C, W)
    infos_by_key = {(i.wse_id, i.local_worker_id): i for i in infos(C, W)}
    # the wafer consumes 7 steps; the workers' iterators are read inside their own contexts
    first = []
    its = {}
    for k, s in samplers.items():
        with worker_context(infos_by_key[k]):
            its[k] = iter(s)
    for step in range(7):
        batch = []
        for c in range(C):
            k = (c, step % W)
            with worker_context(infos_by_key[k]):
                batch += list(next(its[k]))
        first.append(batch)
    states = {k: s.state_dict() for k, s in samplers.items()}
    assert max(st["next_global_batch"] for st in states.values()) == 7

    fresh = _samplers(C, W)
    shards = {}
    for k, s in fresh.items():
        s.load_state_dict(states[k])
        with worker_context(infos_by_key[k]):
            shards[k] = [list(b) for b in s]
    # the rest of the round-robin order starts at step 7, i.e. with worker 7 % W
    rotated = {(c, (w - 7) % W): v for (c, w), v in shards.items()}
    assert first + reassemble(rotated, C, W) == expected


@pytest.mark.parametrize("old,new", [((1, 2), (1, 3)), ((2, 2), (1, 1)), ((1, 1), (3, 1)),
                                     ((2, 1), (2, 4))])
def test_sharded_sampler_resume_with_another_worker_count_continues_the_global_sequence(old, new):
    expected = [list(b) for b in shuffled_batches(n=60, batch_size=4)]  # 15 global batches
    C, W = old
    samplers = _samplers(C, W)
    first = []
    its = {}
    for info in infos(C, W):
        with worker_context(info):
            its[(info.wse_id, info.local_worker_id)] = iter(samplers[(info.wse_id, info.local_worker_id)])
    for step in range(5):
        batch = []
        for c in range(C):
            with worker_context(WorkerInfo(step % W, W, C, c)):
                batch += list(next(its[(c, step % W)]))
        first.append(batch)
    position = max(s.state_dict()["next_global_batch"] for s in samplers.values())
    assert position == 5

    C2, W2 = new
    shards = {}
    for info in infos(C2, W2):
        with worker_context(info):
            s = ShardedSampler(shuffled_batches(n=60, batch_size=4))
            s.load_state_dict({"next_global_batch": position, "epoch": 0})
            shards[(info.wse_id, info.local_worker_id)] = [list(b) for b in s]
    rotated = {(c, (w - position) % W2): v for (c, w), v in shards.items()}
    assert first + reassemble(rotated, C2, W2) == expected


def without_digest(state):
    assert set(state) <= {"next_global_batch", "epoch", "order_digest"}
    return {k: v for k, v in state.items() if k != "order_digest"}


def test_sharded_sampler_resume_at_the_end_of_the_epoch_yields_nothing_then_starts_over():
    s = ShardedSampler(sequential(6, 2))
    s.load_state_dict({"next_global_batch": 3, "epoch": 0})
    assert s.state_dict() == {"next_global_batch": 3, "epoch": 0}
    assert list(s) == []
    assert [list(b) for b in s] == [[0, 1], [2, 3], [4, 5]]
    assert without_digest(s.state_dict()) == {"next_global_batch": 3, "epoch": 0}


def test_sharded_sampler_state_counts_global_batches_after_the_last_one_yielded():
    s = ShardedSampler(sequential(16, 2))
    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=3)):
        it = iter(s)
        assert without_digest(s.state_dict()) == {"next_global_batch": 0, "epoch": 0}
        assert list(next(it)) == [2, 3]
        assert without_digest(s.state_dict()) == {"next_global_batch": 2, "epoch": 0}
        assert list(next(it)) == [8, 9]
        assert without_digest(s.state_dict()) == {"next_global_batch": 5, "epoch": 0}


def test_sharded_sampler_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match=r"^ShardedSampler expects data_source to be an iterable"):
        ShardedSampler(5)
    with pytest.raises(TypeError, match=r"one-shot iterator \(list_iterator\)"):
        ShardedSampler(iter([[0, 1]]))
    s = ShardedSampler(sequential(4, 2))
    with pytest.raises(ValueError) as e:
        s.load_state_dict({"next_global_batch": 2})
    assert str(e.value) == (
        "ShardedSampler.load_state_dict expects what ShardedSampler.state_dict() returned (a "
        "dict with keys ['next_global_batch', 'epoch']), got {'next_global_batch': 2}."
    )
    with pytest.raises(ValueError, match=re.escape(
            "ShardedSampler.load_state_dict: state_dict['next_global_batch'] must be an integer "
            ">= 0, got -1.")):
        s.load_state_dict({"next_global_batch": -1, "epoch": 0})


def test_sharded_sampler_is_exported_from_cstream_utils_data():
    assert cstorch.utils.data.ShardedSampler is ShardedSampler
    assert cstorch.utils.data.DistributedSampler is DistributedSampler
    assert cstorch.utils.data.ParquetDataset is ParquetDataset
    assert cstorch.utils.data.shard_iterable is shard_iterable


# ---------------------------------------------------------------------------------------------
# DistributedSampler
# ---------------------------------------------------------------------------------------------

def test_distributed_sampler_interleaves_samples_and_pads_like_torch():
    shards = per_worker(lambda: [[i] for i in DistributedSampler(range(10))], C=2, W=2)
    assert {k: [b[0] for b in v] for k, v in shards.items()} == {
        (0, 0): [0, 4, 8], (0, 1): [1, 5, 9], (1, 0): [2, 6, 0], (1, 1): [3, 7, 1],
    }
    shards = per_worker(lambda: [[i] for i in DistributedSampler(range(10), drop_last=True)], C=1, W=4)
    assert {k: [b[0] for b in v] for k, v in shards.items()} == {
        (0, 0): [0, 4], (0, 1): [1, 5], (0, 2): [2, 6], (0, 3): [3, 7],
    }


@pytest.mark.parametrize("C,W", TOPOLOGIES)
@pytest.mark.parametrize("shuffle,drop_last,epoch", [(False, False, 0), (True, False, 3), (True, True, 1)])
def test_distributed_sampler_matches_torch_distributed_sampler(C, W, shuffle, drop_last, epoch):
    T = C * W
    for info in infos(C, W):
        with worker_context(info):
            ours = DistributedSampler(range(13), shuffle=shuffle, seed=11, drop_last=drop_last)
            ours.set_epoch(epoch)
            ref = torch.utils.data.DistributedSampler(range(13), num_replicas=T,
                                                      rank=info.global_worker_id, shuffle=shuffle,
                                                      seed=11, drop_last=drop_last)
            ref.set_epoch(epoch)
            assert list(ours) == list(ref)
            assert len(ours) == len(ref)


@pytest.mark.parametrize("C,W", TOPOLOGIES)
def test_distributed_sampler_every_sample_once_per_epoch(C, W):
    shards = per_worker(lambda: [[i] for i in DistributedSampler(range(24), shuffle=True, seed=2)], C, W)
    seen = Counter(b[0] for v in shards.values() for b in v)
    assert seen == Counter(range(24))


def test_distributed_sampler_set_epoch_changes_the_shuffle_deterministically():
    a = DistributedSampler(range(20), shuffle=True, seed=4)
    b = DistributedSampler(range(20), shuffle=True, seed=4)
    e0 = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != e0
    assert sorted(a) == list(range(20))
    assert list(a) == torch.randperm(20, generator=torch.Generator().manual_seed(5)).tolist()


def test_distributed_sampler_reads_the_worker_when_iterated():
    sampler = DistributedSampler(range(6))
    with worker_context(WorkerInfo(local_worker_id=0, num_workers_per_csx=1, num_csx=3, wse_id=2)):
        assert list(sampler) == [2, 5]
        assert len(sampler) == 2
    assert list(sampler) == [0, 1, 2, 3, 4, 5]


def test_distributed_sampler_resumes_mid_epoch_through_a_torch_dataloader():
    info = WorkerInfo(local_worker_id=1, num_workers_per_csx=2, num_csx=1)

    def input_fn():
        sampler = DistributedSampler(torch.arange(40), shuffle=True, seed=9)
        sampler.set_epoch(2)
        return torch.utils.data.DataLoader(torch.arange(40), batch_size=3, sampler=sampler), sampler

    with worker_context(info):
        loader, sampler = input_fn()
        full = [b.tolist() for b in loader]
        loader, sampler = input_fn()
        it = iter(loader)
        head = [next(it).tolist() for _ in range(4)]
        state = sampler.state_dict()
        assert state == {"epoch": 2, "position": 12, "num_replicas": 2}
        sampler2 = DistributedSampler(torch.arange(40), shuffle=True, seed=9)
        loader2 = torch.utils.data.DataLoader(torch.arange(40), batch_size=3, sampler=sampler2)
        loader2.sampler.load_state_dict(state)
        assert loader2.sampler.state_dict() == state
        tail = [b.tolist() for b in loader2]
        assert head + tail == full
        # the next epoch starts from its beginning again
        assert len([b for b in loader2]) == 7


def test_distributed_sampler_resume_with_another_worker_count_is_a_clear_error():
    s = DistributedSampler(range(10))
    s.load_state_dict({"epoch": 0, "position": 2, "num_replicas": 4})
    with pytest.raises(ValueError) as e:
        list(s)
    assert str(e.value) == (
        "DistributedSampler: the state being resumed was saved with 4 workers in all "
        "(num_csx * num_workers_per_csx), but this run has 1. Its position counts samples of one "
        "worker's interleaved share, which differs with the worker count: resume with the "
        "CSConfig the state was saved with."
    )


def test_distributed_sampler_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match=r"^DistributedSampler needs a dataset with len\(\)"):
        DistributedSampler(iter(range(3)))
    with pytest.raises(TypeError, match=r"shuffle=1, drop_last=False"):
        DistributedSampler(range(3), shuffle=1)
    msg = r"^DistributedSampler.set_epoch: epoch must be an integer >= 0, got -1\.$"
    with pytest.raises(ValueError, match=msg):
        DistributedSampler(range(3)).set_epoch(-1)


# ---------------------------------------------------------------------------------------------
# shard_iterable
# ---------------------------------------------------------------------------------------------

def test_shard_iterable_gives_global_worker_g_items_g_plus_multiples_of_t():
    shards = per_worker(lambda: [[x] for x in shard_iterable("abcdefghij")], C=2, W=2)
    assert {k: "".join(b[0] for b in v) for k, v in shards.items()} == {
        (0, 0): "aei", (0, 1): "bfj", (1, 0): "cg", (1, 1): "dh",
    }


@pytest.mark.parametrize("C,W", TOPOLOGIES)
def test_shard_iterable_every_item_once_and_len_matches(C, W):
    for info in infos(C, W):
        with worker_context(info):
            s = shard_iterable(range(19))
            assert len(s) == len(list(s))
    shards = per_worker(lambda: [[x] for x in shard_iterable(range(19))], C, W)
    assert sorted(b[0] for v in shards.values() for b in v) == list(range(19))


def test_shard_iterable_can_be_iterated_once_per_epoch():
    s = shard_iterable(range(6))
    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=3)):
        assert list(s) == [1, 4]
        assert list(s) == [1, 4]


def test_shard_iterable_refuses_one_shot_iterators():
    with pytest.raises(TypeError, match=r"generator is a one-shot iterator"):
        shard_iterable(x for x in range(3))
    with pytest.raises(TypeError, match=r"^shard_iterable expects an iterable, got int: 3\.$"):
        shard_iterable(3)


# ---------------------------------------------------------------------------------------------
# ParquetDataset
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def parquet_files(tmp_path):
    """a.parquet: rows 0..9 in row groups of 3, 3, 3, 1; b.parquet: rows 10..15 in 3, 3."""
    def table(lo, hi):
        return pa.table({
            "x": pa.array(range(lo, hi), pa.int64()),
            "y": pa.array([v / 2 for v in range(lo, hi)], pa.float32()),
            "flag": pa.array([v % 2 == 0 for v in range(lo, hi)]),
            "name": pa.array([f"r{v}" for v in range(lo, hi)]),
        })

    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(table(0, 10), a, row_group_size=3)
    pq.write_table(table(10, 16), b, row_group_size=3)
    return [a, b]


def xs(batches):
    return [b["x"].tolist() for b in batches]


def parquet_input_fn(paths, batch_size, drop_last=False):
    return ParquetDataset(paths, columns=["x"], batch_size=batch_size, drop_last=drop_last)


def parquet_sources(paths, C, W, **kwargs):
    """``{(wse_id, local_worker_id): (info, Source)}``: each worker's loader as the input side
    streams it (epoch after epoch)."""
    from workers.dataloader import DataLoader
    from workers.resume import Source

    loader = DataLoader(parquet_input_fn, paths, **kwargs)
    return {(i.wse_id, i.local_worker_id): (i, Source(loader, loader.build(i))) for i in infos(C, W)}


def single_process(paths, steps, **kwargs):
    """What one process reading the files streams: global batch after global batch."""
    return _take(parquet_sources(paths, 1, 1, **kwargs)[(0, 0)], steps)


def _take(worker, count):
    """The next ``count`` batches of a worker of :func:`parquet_sources`, streamed as it."""
    info, source = worker
    with worker_context(info):
        return [next(source)["x"].tolist() for _ in range(count)]


def test_parquet_dataset_deals_global_batches_round_robin_over_two_workers(parquet_files):
    shards = per_worker(lambda: xs(ParquetDataset(parquet_files, columns=["x"], batch_size=4)), C=1, W=2)
    assert shards == {
        (0, 0): [[0, 1, 2, 3], [8, 9, 10, 11]],  # global batches 0 and 2
        (0, 1): [[4, 5, 6, 7], [12, 13, 14, 15]],  # global batches 1 and 3
    }


def test_parquet_dataset_client_reads_all_rows_in_order_with_their_dtypes(parquet_files):
    ds = ParquetDataset(parquet_files, columns=["x", "y", "flag"], batch_size=5)
    batches = list(ds)
    assert xs(batches) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14], [15]]
    assert [b["y"].dtype for b in batches] == [torch.float32] * 4
    assert batches[0]["flag"].tolist() == [True, False, True, False, True]
    assert batches[1]["y"].tolist() == [2.5, 3.0, 3.5, 4.0, 4.5]
    assert len(ds) == ds.num_global_batches == 4


def test_parquet_dataset_drop_last_drops_only_the_last_short_global_batch(parquet_files):
    # 16 rows in batches of 3: five full global batches and [15], which drop_last leaves out
    shards = per_worker(lambda: xs(ParquetDataset(parquet_files, columns=["x"], batch_size=3,
                                                  drop_last=True)), C=1, W=2)
    assert shards == {(0, 0): [[0, 1, 2], [6, 7, 8], [12, 13, 14]],
                      (0, 1): [[3, 4, 5], [9, 10, 11]]}
    shards = per_worker(lambda: xs(ParquetDataset(parquet_files, columns=["x"], batch_size=3)),
                        C=1, W=2)
    assert shards[(0, 1)] == [[3, 4, 5], [9, 10, 11], [15]]


@pytest.mark.parametrize("C,W,batch_size,drop_last", [
    (1, 2, 3, False), (1, 3, 3, True), (2, 2, 3, True), (2, 2, 4, False), (3, 1, 4, True),
    (1, 8, 3, False),  # 6 global batches an epoch for 8 workers: some get none in an epoch
    (2, 4, 2, False),
])
def test_parquet_dataset_workers_stream_the_single_process_sequence_across_epochs(
        parquet_files, C, W, batch_size, drop_last):
    kwargs = {"batch_size": batch_size, "drop_last": drop_last}
    n = -(-16 // batch_size) if not drop_last else 16 // batch_size
    steps = 3 * n  # three epochs
    expected = single_process(parquet_files, steps, **kwargs)
    for e in range(3):  # one process: every row once per epoch
        rows = sorted(i for b in expected[e * n:(e + 1) * n] for i in b)
        assert rows == list(range(16 if not drop_last else n * batch_size))
    shards = {k: _take(worker, len(range(k[1], steps, W)))
              for k, worker in parquet_sources(parquet_files, C, W, **kwargs).items()}
    assert reassemble(shards, C, W) == expected


@pytest.mark.parametrize("C,W", [(1, 3), (2, 2)])
def test_parquet_dataset_under_dynamic_assignment_any_worker_makes_any_global_batch(
        parquet_files, C, W):
    from workers.context import BatchAssignment, batch_assignment
    from workers.dataloader import DataLoader
    from workers.resume import Source

    steps = 12  # three epochs of 4 global batches
    expected = single_process(parquet_files, steps, batch_size=4)
    rng = __import__("random").Random(5)
    got = {}
    for c in range(C):
        owner = [rng.randrange(W) for _ in range(steps)]
        for w in range(W):
            mine = [s for s in range(steps) if owner[s] == w]
            info = WorkerInfo(local_worker_id=w, num_workers_per_csx=W, num_csx=C, wse_id=c)
            assignment = BatchAssignment()
            assignment.extend(0, mine)
            loader = DataLoader(parquet_input_fn, parquet_files, batch_size=4)
            with worker_context(info), batch_assignment(assignment):
                source = Source(loader, loader.build(info))
                for s in mine:
                    got.setdefault(s, []).extend(next(source)["x"].tolist())
                    assert assignment.pop_taken() == s
    assert [got[s] for s in range(steps)] == expected


def test_parquet_dataset_reads_only_the_row_groups_its_batches_touch(parquet_files,
                                                                      monkeypatch):
    reads = []
    real = pq.ParquetFile.read_row_group

    def counting(self, i, *args, **kwargs):
        reads.append((self.metadata.num_rows, i))
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counting)
    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=3)):
        assert xs(ParquetDataset(parquet_files, columns=["x"], batch_size=2)) == [
            [2, 3], [8, 9], [14, 15]]
    # rows 2-3 span row groups 0 and 1 of a.parquet (10 rows); 8-9: its groups 2 and 3;
    # 14-15: b.parquet's (6 rows) group 1; each read once
    assert reads == [(10, 0), (10, 1), (10, 2), (10, 3), (6, 1)]


def test_parquet_dataset_refuses_a_global_batch_that_cannot_be_sliced_over_the_csxs(
        parquet_files):
    with pytest.raises(ValueError) as e:
        per_worker(lambda: xs(ParquetDataset(parquet_files, columns=["x"], batch_size=3)), C=2, W=1)
    assert str(e.value) == (
        "ParquetDataset: the last global batch of an epoch has 1 row(s) (16 rows = 5 x "
        "batch_size 3 + 1), fewer than num_csx=2, so some CS-X would get no row of it. Use "
        "drop_last=True (it leaves those 1 row(s) out, as one process reading the files with "
        "drop_last=True does), or a batch_size that leaves at least 2 rows in the last batch."
    )
    with pytest.raises(ValueError, match=r"^ParquetDataset: batch_size=2 is smaller than "
                                         r"num_csx=3; every global batch is sliced"):
        per_worker(lambda: xs(ParquetDataset(parquet_files, columns=["x"], batch_size=2)), C=3, W=1)
    shards = per_worker(lambda: xs(ParquetDataset(parquet_files, columns=["x"], batch_size=5,
                                                  drop_last=True)), C=3, W=1)
    assert shards == {(0, 0): [[0, 1], [5, 6], [10, 11]], (1, 0): [[2, 3], [7, 8], [12, 13]],
                      (2, 0): [[4], [9], [14]]}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_parquet_dataset_resumes_mid_row_group_from_its_state(parquet_files, k):
    info = WorkerInfo(local_worker_id=0, num_workers_per_csx=2)
    with worker_context(info):
        full = xs(ParquetDataset(parquet_files, columns=["x"], batch_size=2))
        assert full == [[0, 1], [4, 5], [8, 9], [12, 13]]
        ds = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
        it = iter(ds)
        head = xs(next(it) for _ in range(k))
        state = ds.state_dict()
        resumed = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
        resumed.load_state_dict(state)
        assert head + xs(resumed) == full
        assert xs(resumed) == full  # the next epoch starts over
    # global-batch units: after global batches 0, 2, 4
    assert state == {"epoch": 0, "next_global_batch": 2 * k - 1, "batch_size": 2, "num_rows": 16}


def test_parquet_dataset_state_resumes_with_another_worker_count(parquet_files):
    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2)):
        ds = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
        it = iter(ds)
        next(it), next(it)  # global batches 1 and 3
        state = ds.state_dict()
    assert state["next_global_batch"] == 4
    shards = {}
    for info in infos(1, 3):  # 3 workers take up at global batch 4
        with worker_context(info):
            ds = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
            ds.load_state_dict(state)
            shards[info.local_worker_id] = xs(ds)
    assert shards == {0: [[12, 13]], 1: [[8, 9], [14, 15]], 2: [[10, 11]]}  # 4 % 3 = 1 first


def test_parquet_dataset_state_of_other_batches_is_a_clear_error(parquet_files):
    ds = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
    with pytest.raises(ValueError) as e:
        ds.load_state_dict({"epoch": 0, "next_global_batch": 3, "batch_size": 4, "num_rows": 16})
    assert str(e.value) == (
        "ParquetDataset.load_state_dict: the state was saved reading 16 rows in global batches "
        "of 4, and this dataset has 16 rows in batches of 2; its position counts the saved "
        "run's global batches, which hold other rows here. Resume with the same files and "
        "batch_size.")
    with pytest.raises(ValueError, match=r"next_global_batch=9, but an epoch has 8 global "):
        ds.load_state_dict({"epoch": 0, "next_global_batch": 9, "batch_size": 2, "num_rows": 16})
    with pytest.raises(ValueError, match=r"expects what ParquetDataset.state_dict\(\) returned"):
        ds.load_state_dict({"epoch": 0, "row_group": 3, "offset": 0})  # an older layout


def test_parquet_dataset_in_torch_dataloader_workers_keeps_the_input_workers_order(
        parquet_files):
    def input_fn(num_workers):
        ds = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
        if num_workers == 0:
            return torch.utils.data.DataLoader(ds, batch_size=None)
        return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers,
                                           multiprocessing_context="fork")

    got = {}

    def input_worker(num_workers):  # the input worker's producer thread builds and iterates
        with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2)):
            got[num_workers] = xs(input_fn(num_workers))

    for num_workers in (0, 2):
        thread = threading.Thread(target=input_worker, args=(num_workers,))
        thread.start()
        thread.join()
    # cstream worker 1 of 2 owns global batches 1, 3, 5, 7; its two processes make 1, 5 and
    # 3, 7, and torch's DataLoader reads them back in order
    assert got[2] == got[0] == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_parquet_dataset_pickled_for_a_spawned_torch_worker_keeps_the_input_worker(
        parquet_files, monkeypatch):
    import pickle

    from torch.utils.data._utils import worker as torch_worker

    with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2)):
        shipped = pickle.dumps(ParquetDataset(parquet_files, columns=["x"], batch_size=3))
    # what a "spawn" DataLoader process sees: no cstream worker context, torch worker 0 of 2
    ds = pickle.loads(shipped)
    monkeypatch.setattr(torch_worker, "_worker_info",
                        torch_worker.WorkerInfo(id=0, num_workers=2, seed=0, dataset=ds))
    assert xs(ds) == [[3, 4, 5], [15]]  # worker 1's global batches 1, 3, 5: the 1st and 3rd
    assert len(ds) == 2
    monkeypatch.setattr(torch_worker, "_worker_info", None)
    assert xs(ds)[0] == [0, 1, 2]  # outside a torch worker process the current context counts


def parquet_in_torch_processes(paths):
    ds = ParquetDataset(paths, columns=["x"], batch_size=2)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                       multiprocessing_context="fork")


def test_an_input_worker_reading_parquet_in_torch_processes_keeps_round_robin_and_says_why(
        parquet_files):
    from workers.dataloader import DataLoader
    from workers.input_worker import InputWorkerImpl
    from workers.wire import unpack_reply

    worker = InputWorkerImpl(DataLoader(parquet_in_torch_processes, parquet_files),
                             WorkerInfo(local_worker_id=1, num_workers_per_csx=2), dynamic=True)
    try:
        mode = worker.assignment_mode(timeout_s=60)
        got = [unpack_reply(worker.fetch(i).body)[0]["batch"]["x"].tolist() for i in range(6)]
    finally:
        worker.stop(join_s=10)
    assert mode == ("static", "the ParquetDataset is read by a torch DataLoader with "
                    "num_workers=2, whose worker processes cannot be given batch numbers; "
                    "round-robin delivers the same sequence", 0)
    # global batches 1, 3, 5, 7 of each epoch (8 an epoch), in order
    assert got == [[2, 3], [6, 7], [10, 11], [14, 15], [2, 3], [6, 7]]


def test_parquet_in_torch_processes_resumes_by_batch_count(parquet_files):
    # the dataset here is not the one the torch processes iterate: its state never moves, so
    # the position counts batches and the resumed loader skips them
    from workers.dataloader import DataLoader
    from workers.resume import Source

    loader = DataLoader(parquet_in_torch_processes, parquet_files)
    info = WorkerInfo(local_worker_id=1, num_workers_per_csx=2)
    with worker_context(info):
        source = Source(loader, loader.build(info))
        head = [next(source)["x"].tolist() for _ in range(3)]
        saved = source.position()
        resumed = Source(loader, loader.build(info), saved)
        tail = [next(resumed)["x"].tolist() for _ in range(2)]
    assert "loader_state" not in saved and saved["batch_in_epoch"] == 3
    assert head + tail == [[2, 3], [6, 7], [10, 11], [14, 15], [2, 3]]


def test_which_parquet_loaders_can_be_assigned_dynamically(parquet_files):
    from workers.loaders import dynamic_assignment_support

    ds = ParquetDataset(parquet_files, columns=["x"], batch_size=2)
    assert dynamic_assignment_support(ds) == (
        True, "the loader reads its global batches from a ParquetDataset")
    assert dynamic_assignment_support(torch.utils.data.DataLoader(ds, batch_size=None))[0]
    ok, why = dynamic_assignment_support(
        torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    assert not ok and why == (
        "the ParquetDataset is read by a torch DataLoader with num_workers=2, whose worker "
        "processes cannot be given batch numbers; round-robin delivers the same sequence")


def test_parquet_dataset_missing_or_non_parquet_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        ParquetDataset(tmp_path / "nope.parquet")
    assert str(e.value) == f"ParquetDataset: Parquet file {str(tmp_path / 'nope.parquet')!r} does not exist."
    bad = tmp_path / "notes.parquet"
    bad.write_text("not parquet at all")
    msg = re.escape(f"ParquetDataset: {str(bad)!r} is not a readable Parquet file (")
    with pytest.raises(ValueError, match=msg):
        ParquetDataset(bad)


def test_parquet_dataset_unknown_column_lists_the_available_ones(parquet_files):
    with pytest.raises(ValueError) as e:
        ParquetDataset(parquet_files, columns=["x", "z"])
    assert str(e.value) == (
        f"ParquetDataset: column(s) ['z'] not in {str(parquet_files[0])!r}; its columns are "
        "['x', 'y', 'flag', 'name']."
    )


def test_parquet_dataset_non_numeric_column_names_its_arrow_type(parquet_files):
    with pytest.raises(TypeError) as e:
        ParquetDataset(parquet_files)  # all columns, including the string column
    assert str(e.value) == (
        f"ParquetDataset: column 'name' of {str(parquet_files[0])!r} has Arrow type string, which "
        "is not numeric; only integer, floating point and boolean columns become tensors. Leave "
        "it out with columns=[...] or convert it when writing."
    )


def test_parquet_dataset_null_values_are_a_clear_error(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"v": pa.array([1, None, 3], pa.int64())}), path)
    with pytest.raises(ValueError) as e:
        list(ParquetDataset(path, batch_size=2))
    assert str(e.value) == (
        f"ParquetDataset: column 'v' has 1 null value(s) in row group 0 of {str(path)!r}; tensors "
        "cannot hold nulls. Fill them (e.g. pyarrow.compute.fill_null) before writing."
    )


def test_parquet_dataset_reads_a_directory_of_files_in_name_order(parquet_files, tmp_path):
    ds = ParquetDataset(tmp_path, columns=["x"], batch_size=16)
    assert xs(ds) == [list(range(16))]
    with pytest.raises(ValueError, match=r"^ParquetDataset: batch_size must be an integer >= 1, got 0\.$"):
        ParquetDataset(tmp_path, columns=["x"], batch_size=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(ParquetDataset(tmp_path, columns=["x"], batch_size=16)) == 1


# ---------------------------------------------------------------------------------------------
# With the input side's own epoch loop (CPU backend) and input workers
# ---------------------------------------------------------------------------------------------

def shuffled_input_fn():
    """Global batches reshuffled every epoch, each worker streaming its share of each."""
    data = torch.arange(100, 124)
    order = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=8)
    batches = BatchSampler(order, batch_size=4, drop_last=True)  # 6 global batches an epoch
    return torch.utils.data.DataLoader(data, batch_sampler=ShardedSampler(batches))


def test_input_workers_see_the_cpu_backends_global_batches_across_epochs():
    from workers.dataloader import DataLoader
    from workers.resume import Source

    loader = DataLoader(shuffled_input_fn)
    cpu = Source(loader, loader.build())
    expected = [next(cpu).tolist() for _ in range(18)]  # three epochs
    assert expected[:6] != expected[6:12] != expected[12:]
    assert sorted(i for b in expected[6:12] for i in b) == list(range(100, 124))

    C, W = 2, 3
    shards = {}
    for info in infos(C, W):
        with worker_context(info):
            source = Source(loader, loader.build(info))
            shards[(info.wse_id, info.local_worker_id)] = [next(source).tolist() for _ in range(6)]
    assert reassemble(shards, C, W) == expected


def test_input_worker_resumes_a_sharded_sampler_from_its_saved_state():
    from workers.dataloader import DataLoader
    from workers.resume import Source

    loader = DataLoader(shuffled_input_fn)
    info = WorkerInfo(local_worker_id=1, num_workers_per_csx=2, num_csx=2, wse_id=1)
    with worker_context(info):
        source = Source(loader, loader.build(info))
        full = [next(source).tolist() for _ in range(7)]  # 3 batches an epoch
        source = Source(loader, loader.build(info))
        head = [next(source).tolist() for _ in range(4)]  # epoch 1, one batch in
        saved = source.position()
        assert (saved["epoch"], saved["batch_in_epoch"], without_digest(saved["loader_state"])) == (
            1, 1, {"next_global_batch": 2, "epoch": 1})
        resumed = Source(loader, loader.build(info), saved)
        assert head + [next(resumed).tolist() for _ in range(3)] == full
