"""Tensors a traced step creates itself (``torch.zeros``, ``torch.full``, ``torch.tensor``) and
then changes in place start from their created value in every step, on every backend and
compiler: none is a constant of the graph that carries one step's changes into the next."""

from __future__ import annotations

import pytest
import torch

import cstream as cstorch
from cstream import metrics
from executor import runtime

IDIOMS = ("scatter_add_", "index_add_", "full_add_", "tensor_mul_", "loop_fill", "ones_sum",
          "where_scalar")


def made_in_step(idiom: str, x: torch.Tensor) -> torch.Tensor:
    """A tensor created inside the step (changed in place), from the batch ``x`` (5,)."""
    if idiom == "scatter_add_":
        z = torch.zeros(5, dtype=torch.float64)
        z.scatter_add_(0, torch.arange(5), x)
    elif idiom == "index_add_":
        z = torch.zeros(5, dtype=torch.float64)
        z.index_add_(0, torch.tensor([4, 3, 2, 1, 0]), x)
    elif idiom == "full_add_":
        z = torch.full((5,), 2.0, dtype=torch.float64)
        z.add_(x)
    elif idiom == "tensor_mul_":
        z = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
        z.mul_(x)
    elif idiom == "ones_sum":  # no input of the step: the graph's own value
        z = torch.ones(5, dtype=torch.float64).sum()
    elif idiom == "where_scalar":
        z = torch.where(x > 3, x, 1.0)
    else:
        z = torch.zeros(5, dtype=torch.float64)
        for i in range(5):
            z[i] += x[i] * (i + 1)
    return z


class Sums(metrics.Metric):
    """One sum per idiom of the tensor it makes in each step."""

    def reset(self):
        for idiom in IDIOMS:
            self.register_state(idiom, torch.zeros(5, dtype=torch.float64))

    def update(self, x):
        x = x.double()
        for idiom in IDIOMS:
            getattr(self, idiom).add_(made_in_step(idiom, x))

    def compute(self):
        return {idiom: getattr(self, idiom).to("cpu").clone() for idiom in IDIOMS}


def batches():
    return [torch.arange(5.0) * (i + 1) + 1 for i in range(3)]


def run(kind: str, **options) -> list[dict]:
    """The sums after each of three steps."""
    runtime.reset()
    cstorch.backend(kind, **options)
    sums = Sums("sums")
    per_step = []

    @cstorch.step_closure
    def record():
        per_step.append({idiom: v.tolist() for idiom, v in sums.compute().items()})

    @cstorch.trace
    def step(x):
        sums(x)
        record()

    loader = cstorch.utils.data.DataLoader(batches)
    for batch in cstorch.utils.data.DataExecutor(loader, num_steps=3):
        step(batch)
    return per_step


def test_the_cpu_backend_sums_each_steps_fresh_tensor():
    """The reference the other tests compare with: step ``k`` adds only its own batch."""
    steps = run("CPU")
    zeros = torch.zeros(5, dtype=torch.float64)
    assert len(steps) == 3
    for idiom in IDIOMS:
        first = zeros + made_in_step(idiom, batches()[0].double())
        assert steps[0][idiom] == first.tolist()
        total = zeros + sum(made_in_step(idiom, b.double()) for b in batches())
        assert steps[2][idiom] == total.tolist()


@pytest.mark.parametrize("options", [dict(in_process=True, compiler="fx"),
                                     dict(in_process=True)], ids=["fx", "auto"])
def test_fresh_tensors_changed_in_place_equal_the_cpu_backend_in_process(options):
    assert run("CSX", **options) == run("CPU")


def test_fresh_tensors_changed_in_place_equal_the_cpu_backend_on_ray(ray_session):
    assert run("CSX") == run("CPU")


def test_steps_with_tensors_made_inside_compile_with_inductor_and_equal_fx():
    """Constants of the graph (``torch.tensor``, ``torch.full``, a scalar of ``where``) and
    values that depend on no input of the step are inputs of inductor's compiled function
    like any other."""
    fx = run("CSX", in_process=True, compiler="fx")
    inductor = run("CSX", in_process=True, compiler="inductor")
    assert len(inductor) == 3
    for got, want in zip(inductor, fx):
        for idiom in IDIOMS:
            assert got[idiom] == pytest.approx(want[idiom], rel=1e-12), idiom
