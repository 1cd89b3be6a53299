"""Whole models on the CSX backend (traced, replayed) against the CPU backend (eager)."""

from __future__ import annotations

import re

import pytest
import torch

import cstream as cstorch
from helpers.models import TinyLM, lm_input_fn
from test_optim import CustomOptimizer, CustomScheduler


def train_lm(kind, make_optimizer, make_scheduler, use_scaler, steps=50, **options):
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    with backend.device:
        model = TinyLM()
    compiled = cstorch.compile(model, backend)
    optimizer = make_optimizer(model.parameters())
    scheduler = make_scheduler(optimizer)
    scaler = cstorch.amp.GradScaler("dynamic", init_scale=2.0 ** 10, steps_per_increase=10) \
        if use_scaler else None
    losses = []

    @cstorch.compile_step
    def training_step(batch):
        inputs, targets = batch
        logits = compiled(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1))
        cstorch.amp.optimizer_step(loss, optimizer, scaler, max_gradient_norm=1.0)
        scheduler.step()
        return loss

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(lm_input_fn),
                                               num_steps=steps)
    for batch in executor:
        record(training_step(batch))
    final = {k: v.to("cpu").clone() for k, v in model.state_dict().items()}
    backend.shutdown()
    return losses, final


def adamw(params):
    return cstorch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)


def warmup_cosine(opt):
    return cstorch.optim.configure_lr_scheduler(opt, [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 3e-3,
         "total_iters": 10},
        {"scheduler": "CosineDecay", "initial_learning_rate": 3e-3, "end_learning_rate": 1e-4,
         "total_iters": 40},
    ])


@pytest.mark.parametrize("setup", ["adamw_warmup_scaler", "custom_optimizer_and_scheduler"])
def test_a_small_transformer_lm_on_csx_equals_cpu_at_every_one_of_50_steps(setup):
    if setup == "adamw_warmup_scaler":
        args = (adamw, warmup_cosine, True)
    else:
        args = (lambda p: CustomOptimizer(p, lr=0.05), lambda o: CustomScheduler(o, peak=0.05),
                False)
    cpu_losses, cpu_final = train_lm("CPU", *args)
    csx_losses, csx_final = train_lm("CSX", *args, in_process=True)
    assert len(cpu_losses) == len(csx_losses) == 50
    for i, (a, b) in enumerate(zip(cpu_losses, csx_losses)):
        assert abs(a - b) <= 1e-5, (i, a, b)
    assert cpu_losses[-1] < cpu_losses[0]
    for k in cpu_final:
        assert torch.allclose(cpu_final[k], csx_final[k], atol=1e-5), k


def _example_losses(capsys, *args):
    from examples import train
    train.main(["--steps", "50", "--log-every", "1", "--checkpoint-steps", "25", *args])
    out = capsys.readouterr().out
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)], out


def test_the_seed_full_training_example_on_csx_equals_cpu(tmp_path, capsys):
    cpu, _ = _example_losses(capsys, "--backend", "CPU", "--artifact-dir", str(tmp_path / "c"))
    csx, out = _example_losses(capsys, "--in-process", "--artifact-dir", str(tmp_path / "x"))
    assert len(cpu) == len(csx) == 50
    assert max(abs(a - b) for a, b in zip(cpu, csx)) <= 1e-4  # printed with 4 decimals
    assert "saved" in out and "checkpoint_25.h5" in out and "checkpoint_50.h5" in out
    assert sorted(p.name for p in (tmp_path / "x" / "checkpoints").glob("*.h5")) == [
        "checkpoint_25.h5", "checkpoint_50.h5"]
