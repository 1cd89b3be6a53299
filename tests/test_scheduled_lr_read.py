"""What a step reads from a param group a scheduler feeds, and what a step returns that is state.

As in ``cerebras.pytorch``: ``group["lr"]`` read in the step before ``sched.step()`` is the rate
that step's optimizer used (``step()`` rebinds the group, it does not overwrite that value);
after ``sched.step()`` it is the next rate; outside the step (``state_dict()`` in a checkpoint
closure, after the run) it is the current rate. A step output that is a state tensor the step
updates in place is its value at the end of that step, every step. CPU (eager), CSX in process
(traced once, or every step) and CSX on Ray give the same numbers.
"""

from __future__ import annotations

import pytest
import torch

import cstream as cstorch
from cstream.optim import lr_scheduler as lrs

STEPS = 7
# LinearLR from 0.001 to 0.01 over 5 steps: the rate of steps 1..7, then after step 7
RATES = [0.001, 0.0028, 0.0046, 0.0064, 0.0082, 0.01, 0.01, 0.01]


def _run(kind: str, **options) -> dict:
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    model = torch.nn.Linear(3, 1)
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.5)
    sched = lrs.LinearLR(opt, initial_learning_rate=0.001, end_learning_rate=0.01,
                         total_iters=5)
    with backend.device:
        counter = cstorch.zeros(())
    got = {"lr": [], "counter": [], "loss": [], "lr_after_step": [], "last_lr": [],
           "saved_lr": []}

    @cstorch.trace
    def step(x):
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        lr = opt.param_groups[0]["lr"]
        sched.step()
        inside(opt.param_groups[0]["lr"])
        count = counter
        counter.add_(1)
        return loss, lr, count

    @cstorch.step_closure
    def inside(lr_after_step):
        got["lr_after_step"].append(float(lr_after_step))
        got["last_lr"].append(float(sched.get_last_lr()[0]))

    @cstorch.step_closure
    def record(loss, lr, count):
        got["loss"].append(loss.item())
        got["lr"].append(float(lr))
        got["counter"].append(float(count))

    @cstorch.checkpoint_closure
    def save():
        got["saved_lr"].append(float(opt.state_dict()["param_groups"][0]["lr"]))

    data = [torch.full((4, 3), float(i + 1)) / 10 for i in range(STEPS)]
    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(lambda: data),
                                               num_steps=STEPS, checkpoint_steps=3)
    for i, x in enumerate(executor, 1):
        record(*step(x))
        if i % 3 == 0:
            save()
    got["final_lr"] = float(opt.param_groups[0]["lr"])
    got["final_last_lr"] = float(sched.get_last_lr()[0])
    got["weight"] = model.weight.to("cpu").clone()
    backend.shutdown()
    return got


def _check(got: dict, cpu: dict) -> None:
    assert got["lr"] == pytest.approx(RATES[:STEPS], rel=1e-6)
    assert got["lr_after_step"] == pytest.approx(RATES[1:], rel=1e-6)
    assert got["last_lr"] == pytest.approx(RATES[1:], rel=1e-6)
    assert got["saved_lr"] == pytest.approx([RATES[3], RATES[6]], rel=1e-6)
    assert got["final_lr"] == got["final_last_lr"] == pytest.approx(RATES[STEPS], rel=1e-6)
    assert got["counter"] == [float(i) for i in range(1, STEPS + 1)]
    if got is not cpu:
        assert got["loss"] == pytest.approx(cpu["loss"], rel=1e-6)
        assert torch.allclose(got["weight"], cpu["weight"], atol=1e-7)


@pytest.fixture(scope="module")
def cpu_run() -> dict:
    return _run("CPU")


def test_on_cpu_the_lr_read_before_sched_step_is_the_rate_its_optimizer_step_used(cpu_run):
    _check(cpu_run, cpu_run)


@pytest.mark.parametrize("options", [{}, {"retrace_every_iteration": True}],
                         ids=["traced-once", "retraced"])
def test_on_csx_in_process_lr_reads_and_state_outputs_equal_the_cpu_backend(cpu_run, options):
    _check(_run("CSX", in_process=True, **options), cpu_run)


def test_on_csx_on_ray_lr_reads_and_state_outputs_equal_the_cpu_backend(ray_session, cpu_run):
    _check(_run("CSX"), cpu_run)
