"""A buffer the traced step assigns a new tensor to (``self.center = ...``, as the Model Zoo's
DINO and iBOT losses update their centres) is state: each step starts from the value the step
before assigned, the module's attribute stays the state tensor, and a checkpoint stores it."""

from __future__ import annotations

import torch

import cstream as cstorch


class Centred(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.register_buffer("center", torch.zeros(3))
        self.register_buffer("step", torch.zeros(1, dtype=torch.int32))

    def forward(self, x):
        out = self.linear(x)
        loss = ((out - self.center) ** 2).mean()
        self.center = self.center * 0.9 + out.detach().mean(0) * 0.1  # a new tensor
        self.step += 1  # in place
        return loss


def _batches():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(5, 4, generator=g) for _ in range(3)]


def _run(backend_name, tmp_path):
    torch.manual_seed(0)
    model = Centred()
    if backend_name == "CPU":
        backend = cstorch.backend("CPU")
    else:
        backend = cstorch.backend("CSX", in_process=True)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    losses = []

    @cstorch.trace
    def step(x):
        loss = compiled(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    loader = cstorch.utils.data.DataLoader(_batches)
    for x in cstorch.utils.data.DataExecutor(loader, num_steps=3):
        record(step(x))
    path = tmp_path / f"{backend_name}.mdl"
    cstorch.save({"model": model.state_dict()}, path)
    backend.shutdown()
    return losses, cstorch.load(path)["model"]


def test_a_reassigned_buffer_carries_from_step_to_step_and_is_saved(tmp_path):
    cpu_losses, cpu_state = _run("CPU", tmp_path)
    csx_losses, csx_state = _run("CSX", tmp_path)
    assert csx_losses == cpu_losses
    assert torch.equal(csx_state["center"], cpu_state["center"])
    assert cpu_state["step"].item() == csx_state["step"].item() == 3
    assert cpu_state["center"].abs().sum() > 0
