"""Exactly-once streaming and resume from a checkpoint's dataloader state."""

from __future__ import annotations

import pytest
import torch

import cstream as cstorch

from helpers.runs import record_run, whole_batch


def ids_input_fn(n=10, batch=2):
    """Global batches of sample ids; each worker takes its share of whole batches."""
    info = cstorch.distributed.get_worker_info()
    batches = [torch.arange(i * batch, (i + 1) * batch) for i in range(n)]
    return batches[info.local_worker_id::info.num_workers_per_csx]


def run(kind, steps, cs_config=None, **options):
    """The ids the wafer sees in ``steps`` steps of :func:`ids_input_fn`, and the loader's
    states at the checkpoint steps."""
    recorded = record_run(kind, ids_input_fn, steps, cs_config, value=whole_batch, **options)
    return recorded.seen, recorded.states


@pytest.mark.parametrize("kind,options", [("CPU", {}), ("CSX", {"in_process": True})])
def test_a_resumed_run_continues_the_sample_sequence_exactly(kind, options, tmp_path):
    cfg = cstorch.utils.CSConfig(num_workers_per_csx=1)
    full, _ = run(kind, 14, cfg, artifact_dir=tmp_path, **options)
    assert full == list(range(20)) + list(range(8))  # 10 batches, then a new epoch
    first, states = run(kind, 7, cfg, checkpoint_steps=3, artifact_dir=tmp_path, **options)
    assert sorted(states) == [2, 5, 6]
    # resume from step 3 twice in a row, then from the epoch boundary
    second, states2 = run(kind, 4, cfg, resume=states[2], checkpoint_steps=4,
                          artifact_dir=tmp_path, **options)
    assert first[:6] + second == full[:14]
    third, _ = run(kind, 7, cfg, resume=states2[3], artifact_dir=tmp_path, **options)
    assert first[:6] + second + third == full


def test_every_sample_reaches_the_wafer_once_with_several_in_process_workers(tmp_path):
    global ids_input_fn
    plain = ids_input_fn
    ids_input_fn = lambda: plain(n=24)  # noqa: E731  (24 batches: divisible by 1, 2, 3, 4, 8)
    try:
        for workers in (1, 2, 3, 4, 8):
            cfg = cstorch.utils.CSConfig(num_workers_per_csx=workers)
            seen, _ = run("CSX", 24, cfg, in_process=True, artifact_dir=tmp_path)
            assert seen == list(range(48)), workers
    finally:
        ids_input_fn = plain


def test_dataloader_state_dict_outside_a_checkpoint_closure_is_an_error():
    loader = cstorch.utils.data.DataLoader(ids_input_fn)
    with pytest.raises(RuntimeError, match="inside a @cstream.checkpoint_closure"):
        loader.state_dict()


def test_loading_something_that_is_not_a_dataloader_state_is_an_error():
    loader = cstorch.utils.data.DataLoader(ids_input_fn)
    with pytest.raises(ValueError, match="format 'cstream.dataloader/1'"):
        loader.load_state_dict({"model": 1})
