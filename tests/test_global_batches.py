"""The Release 2.x ``DistributedSampler`` (global batches), which the Model Zoo 2.10's map-style
data processors give their DataLoader as its ``batch_sampler``: the orders the real
cerebras-pytorch 2.10 draws (the lists below were printed by it, for the same calls; torch's
``randperm`` with a seeded CPU generator draws the same permutation in torch 2.4 and 2.13), the
carry-over of samples left at an epoch's end, padding, ``set_state`` on resume, and its shards
on the input workers."""

from __future__ import annotations

import pytest

from cstream.utils.data import DistributedSampler
from cstream.utils.data.sampler import pad_index
from workers.context import WorkerInfo, streamer_context, worker_context
from workers.sharding import GlobalBatchSampler


def test_the_release_2_arguments_give_the_global_batch_sampler_and_isinstance_holds():
    sampler = DistributedSampler(range(10), shuffle=False, batch_size=4)
    assert isinstance(sampler, GlobalBatchSampler) and isinstance(sampler, DistributedSampler)
    assert type(DistributedSampler(range(10))) is DistributedSampler  # the interleaving form


def test_samples_left_at_an_epochs_end_start_the_next_epoch():
    sampler = DistributedSampler(range(10), shuffle=False, batch_size=4)
    assert len(sampler) == 2
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(sampler) == [[8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]


def test_the_shuffle_is_the_real_packages():
    sampler = DistributedSampler(range(16), shuffle=True, seed=3, batch_size=4)
    assert list(sampler) == [[10, 9, 5, 6], [8, 11, 3, 1], [13, 7, 14, 12], [4, 15, 0, 2]]
    assert list(sampler) == [[10, 0, 7, 4], [13, 8, 15, 11], [1, 9, 14, 12], [6, 5, 3, 2]]
    assert list(DistributedSampler(range(10), shuffle=True, seed=3, batch_size=4)) == \
        [[6, 0, 3, 7], [8, 5, 1, 9]]


def test_a_longer_epoch_repeats_the_dataset_in_one_shuffled_order():
    sampler = DistributedSampler(range(10), shuffle=True, seed=3, batch_size=4, num_samples=23)
    assert len(sampler) == 5
    assert list(sampler) == [[4, 9, 8, 2], [3, 5, 4, 6], [7, 5, 6, 1], [9, 7, 1, 3], [8, 3, 0, 0]]
    assert len(sampler) == 6  # the 3 left over count in the next epoch


def test_the_last_batch_is_padded_with_pad_index():
    batches = list(DistributedSampler(range(10), shuffle=False, batch_size=4, drop_last=False,
                                      pad_last=True))
    assert batches[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert batches[2][:2] == [8, 9] and batches[2][2] is pad_index and batches[2][3] is pad_index


def test_set_state_continues_after_the_samples_streamed_as_the_real_package():
    sampler = DistributedSampler(range(16), shuffle=True, seed=3, batch_size=4)
    sampler.set_state(8)
    assert list(sampler) == [[13, 7, 14, 12], [4, 15, 0, 2]]
    assert list(sampler) == [[10, 0, 7, 4], [13, 8, 15, 11], [1, 9, 14, 12], [6, 5, 3, 2]]
    sampler.set_state(20)  # in the second epoch
    assert list(sampler) == [[13, 8, 15, 11], [1, 9, 14, 12], [6, 5, 3, 2]]


def test_set_state_off_a_global_batch_is_refused_with_the_reason():
    sampler = DistributedSampler(range(16), shuffle=False, batch_size=4)
    with pytest.raises(ValueError, match=r"set_state\(6\): the position is not at a global batch"):
        sampler.set_state(6)


def test_each_cs_x_takes_its_slice_and_the_workers_alternate():
    """2 CS-Xs with 2 workers each: global batch i goes to worker i % 2 of both systems, each
    system its half; read in step order they give back the client's global batches."""
    sampler = DistributedSampler(range(16), shuffle=True, seed=3, batch_size=4)
    expected = list(sampler)
    got = {}
    for wse in range(2):
        for worker in range(2):
            info = WorkerInfo(local_worker_id=worker, num_workers_per_csx=2, num_csx=2,
                              wse_id=wse)
            with worker_context(info), streamer_context():
                shard = DistributedSampler(range(16), shuffle=True, seed=3, batch_size=4)
                got[wse, worker] = list(shard)
    for i, batch in enumerate(expected):
        assert got[0, i % 2][i // 2] + got[1, i % 2][i // 2] == batch


def test_on_csx_batches_must_keep_one_size():
    with streamer_context():
        with pytest.raises(ValueError, match="drop_last=True or pad_last=True"):
            DistributedSampler(range(10), batch_size=4, seed=0, drop_last=False)
        with pytest.raises(ValueError, match="needs batch_size"):
            DistributedSampler(range(10), seed=0, shard=True)  # no batch size
