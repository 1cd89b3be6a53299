"""A checkpoint step's state crosses from the wafer driver in pieces, the next on its way while the
save writes the one before (executor/backends/snapshot_fetch.py): the pieces cover the state
once, in the order the save reads it, and the file holds the same values as one fetch gives."""

from __future__ import annotations

import torch

import cstream as cstorch
from executor.backends import snapshot_fetch
from executor.backends.driver_client import RayDriverClient


def _input_fn(batch_size):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g),
                                          torch.randn(64, 2, generator=g))
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(data),
                                            batch_size, drop_last=True)
    return torch.utils.data.DataLoader(
        data, batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def _train_and_save(tmp_path, name: str) -> dict:
    """6 steps of an MLP with AdamW on the Ray wafer, saved at step 3; the file's tensors."""
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path / f"art_{name}"))
    with backend.device:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 2))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.configure_optimizer("AdamW", model.parameters(), lr=1e-2)

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    path = tmp_path / f"{name}.mdl"

    @cstorch.checkpoint_closure
    def save(i):
        if i == 3:
            cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(_input_fn, batch_size=8), num_steps=6, checkpoint_steps=3,
        cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=1))
    for i, batch in enumerate(executor, 1):
        step(batch)
        save(i)
    backend.shutdown()
    loaded = cstorch.load(path)
    out = {f"model.{k}": v for k, v in loaded["model"].items()}
    for p, s in loaded["optimizer"]["state"].items():
        out.update({f"optimizer.{p}.{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)})
    return out


def test_pieces_of_one_tensor_each_cover_the_state_in_read_order_and_save_what_one_fetch_saves(
        ray_session, tmp_path, monkeypatch):
    whole = _train_and_save(tmp_path, "whole")
    asked: list[list[int]] = []
    real = RayDriverClient.snapshot_async

    def spy(self, step, keys):
        asked.append(list(keys))
        return real(self, step, keys)

    monkeypatch.setattr(RayDriverClient, "snapshot_async", spy)
    monkeypatch.setattr(snapshot_fetch, "PIECE_BYTES", 1)  # every tensor a piece of its own
    pieces = _train_and_save(tmp_path, "pieces")
    # 4 weights and biases, each with 2 Adam moments (and the step counts) at step 3, every one
    # asked for once, one call each, the keys increasing: the order the save read them in
    keys = [k for piece in asked for k in piece]
    assert all(len(piece) == 1 for piece in asked)
    assert len(keys) == len(set(keys)) >= 12
    assert keys == sorted(keys)
    assert pieces.keys() == whole.keys()
    for k in whole:
        assert torch.equal(pieces[k], whole[k]), k
