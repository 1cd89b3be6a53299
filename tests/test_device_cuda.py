"""On a CUDA GPU, every cstream object follows the model's device and gives the CPU backend's
results: the GPU backend (``cstream.backend("GPU")``) and the CSX wafer on CUDA
(``cstream.backend("CSX", device="cuda")``, in this process), each against the CPU backend.

Every test here is marked ``cuda`` and skips where ``torch.cuda.is_available()`` is False;
``make gpu-check`` (benchmarks/gpu_check.py) runs them. Tolerances: a GPU and a CPU run the
same float32 arithmetic with other kernels (other summation orders, fused multiply-adds), so
values made on the two agree to a few float32 ulps per operation; over the handful of steps
here a relative 1e-5 (with an absolute floor of 1e-6 for values near 0) bounds that. Counts,
loss scales (powers of two) and values read twice on one device are compared exactly.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cstream as cstorch
from test_device import metric_cases

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False here"),
]

DEVICE = torch.device("cuda", 0)
# where the objects run, against the CPU backend: kind and options of cstream.backend
TARGETS = {"gpu": ("GPU", {}), "csx_cuda": ("CSX", {"device": "cuda", "in_process": True})}
REL, ABS = 1e-5, 1e-6  # float32 on two kinds of hardware, a few steps (module docstring)
ROOT = Path(__file__).resolve().parent.parent


def backend_of(target: str, tmp_path: Path):
    kind, options = ("CPU", {}) if target == "cpu" else TARGETS[target]
    return cstorch.backend(kind, artifact_dir=tmp_path / target, **options)


def close(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == pytest.approx(w, rel=REL, abs=ABS), (i, got, want)


def executor_of(batches, **kwargs):
    return cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: list(batches)), num_steps=len(batches), **kwargs)


def regression_batches(n=6, inf_at=None):
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        x, y = torch.randn(12, 8, generator=g), torch.randn(12, 1, generator=g)
        if i == inf_at:
            x[0, 0] = float("inf")  # a step the dynamic loss scaler must skip
        out.append((x, y))
    return out


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


class DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.5), torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def cpu_values(state: dict) -> dict:
    return {k: v.detach().to("cpu").clone() for k, v in state.items()}


# -- metrics --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(metric_cases("cpu")))
def test_every_metric_gives_the_cpu_backends_value(name, target, tmp_path):
    def run(where):
        backend = backend_of(where, tmp_path)
        factory, inputs = metric_cases("cpu")[name]
        keys = list(inputs)
        batch = tuple(inputs[k] for k in keys)
        metric = factory()

        @cstorch.trace
        def step(batch):
            metric(**dict(zip(keys, batch)))
            return batch[0].sum()

        for b in executor_of([batch, batch]):
            step(b)
        if where == "gpu":
            assert {t.device for t in metric.buffers()} == {DEVICE}
        value = float(metric)
        backend.shutdown()
        return value

    assert run(target) == pytest.approx(run("cpu"), rel=REL, abs=ABS)


def test_a_metric_built_before_the_gpu_backend_moves_to_the_gpu_on_its_first_update(tmp_path):
    accuracy = cstorch.metrics.AccuracyMetric("acc")
    backend = backend_of("gpu", tmp_path)
    accuracy(labels=torch.tensor([1, 2, 3], device=DEVICE),
             predictions=torch.tensor([1, 2, 0], device=DEVICE))
    assert {t.device for t in accuracy.buffers()} == {DEVICE}
    assert float(accuracy) == pytest.approx(2 / 3)
    backend.shutdown()


# -- optimizer, scheduler, loss scaler, summaries: one training loop ---------------------------------

def train(target, tmp_path, steps=6):
    """SGD with momentum, a linear warm-up, dynamic loss scaling with clipping (step 3 holds an
    inf, so the scaler skips it), summaries of the loss and a weight; returns the losses, the
    rates, the scalars and tensors written, the scaler's state and the weights after the run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    backend = backend_of(target, tmp_path)
    model = MLP()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = cstorch.optim.lr_scheduler.LinearLR(opt, 0.01, 0.05, 4)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=2.0 ** 10,
                                    steps_per_increase=2)
    logdir = tmp_path / f"tb_{target}"
    writer = SummaryWriter(str(logdir))
    losses, lrs = [], []

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((compiled(x) - y) ** 2).mean()
        cstorch.amp.optimizer_step(loss, opt, scaler, max_gradient_norm=1.0)
        sched.step()
        cstorch.summarize_scalar("loss", loss)
        cstorch.summarize_tensor("weight", model.net[0].weight)
        return loss

    @cstorch.step_closure
    def keep(loss):
        assert loss.device.type == "cpu"  # a closure reads its tensors on the CPU
        losses.append(loss.item())
        lrs.append(float(sched.get_last_lr()[0]))

    for batch in executor_of(regression_batches(steps, inf_at=2), writer=writer):
        keep(step(batch))
    writer.close()
    scale = {k: float(v) for k, v in scaler.state_dict().items()}
    weights = cpu_values(model.state_dict())
    if target == "gpu":
        on = {p.device for p in model.parameters()}
        on |= {v.device for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor)}
        on |= {sched.last_epoch.device, *(v.device for v in scaler.state_dict().values())}
        assert on == {DEVICE}
    backend.shutdown()
    events = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("loss")]
    tensors = [(e.step, torch.from_numpy(tensor_util.make_ndarray(e.tensor_proto)))
               for e in events.Tensors("weight")]
    return losses, lrs, scalars, tensors, scale, weights


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_training_with_a_scheduler_a_loss_scaler_and_summaries_gives_the_cpu_backends_run(
        target, tmp_path):
    got = train(target, tmp_path)
    want = train("cpu", tmp_path)
    (g_losses, g_lrs, g_scalars, g_tensors, g_scale, g_weights) = got
    (w_losses, w_lrs, w_scalars, w_tensors, w_scale, w_weights) = want
    assert math.isnan(w_losses[2]) and math.isnan(g_losses[2])  # the inf step, on both
    close([v for i, v in enumerate(g_losses) if i != 2], [v for i, v in enumerate(w_losses)
                                                           if i != 2])
    close(g_lrs, w_lrs)
    assert [s for s, _ in g_scalars] == [s for s, _ in w_scalars] == [1, 2, 3, 4, 5, 6]
    close([v for s, v in g_scalars if s != 3], [v for s, v in w_scalars if s != 3])
    assert [s for s, _ in g_tensors] == [s for s, _ in w_tensors] == [1, 2, 3, 4, 5, 6]
    for (_, g), (_, w) in zip(g_tensors, w_tensors):
        assert g.shape == (32, 8) and torch.allclose(g, w, rtol=REL, atol=ABS)
    assert g_scale == w_scale  # powers of two and counts: exact
    assert w_scale["num_skipped_steps"] == 1
    for name in w_weights:
        assert torch.allclose(g_weights[name], w_weights[name], rtol=REL, atol=ABS), name


@pytest.mark.parametrize("case", ["linear", "cosine_decay", "sequential", "one_cycle",
                                  "cyclic_exp_range", "wd_sequential_tagged"])
def test_schedulers_on_the_gpu_backend_give_the_cpu_backends_rates(case, tmp_path):
    from reference.gen_sched import CASES, build, make_optimizer

    def rates(where):
        backend = backend_of(where, tmp_path)
        opt = make_optimizer(cstorch)
        sched = build(cstorch, opt, CASES[case])
        out = []
        for _ in range(30):
            sched.step()
            out += [float(v) for v in sched.get_last_value() if v is not None]
        if where == "gpu":
            assert sched.last_epoch.device == DEVICE
        backend.shutdown()
        return out

    close(rates("gpu"), rates("cpu"))


# -- checkpoints -----------------------------------------------------------------------------------

def run_and_save(target, tmp_path, path, resume=None, steps=3):
    """``steps`` steps of the MLP with Adam, optionally from a checkpoint, saving model and
    optimizer at the last step; returns the losses."""
    torch.manual_seed(0)
    backend = backend_of(target, tmp_path)
    model = MLP()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.Adam(model.parameters(), lr=0.01)
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
    losses = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((compiled(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.step_closure
    def keep(loss):
        losses.append(loss.item())

    @cstorch.checkpoint_closure
    def save(i):
        cstorch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)

    for i, batch in enumerate(executor_of(regression_batches(steps), checkpoint_steps=steps), 1):
        keep(step(batch))
        save(i)
    backend.shutdown()
    return losses


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_checkpoint_saved_on_the_gpu_resumes_on_the_cpu_and_the_other_way_round(
        target, tmp_path):
    on_gpu, on_cpu = tmp_path / "gpu.h5", tmp_path / "cpu.h5"
    close(run_and_save(target, tmp_path, on_gpu), run_and_save("cpu", tmp_path, on_cpu))
    saved_gpu = cstorch.load(on_gpu)  # read into CPU memory, as torch.load(map_location="cpu")
    saved_cpu = cstorch.load(on_cpu)
    for name, value in saved_cpu["model"].items():
        assert saved_gpu["model"][name].device.type == "cpu"
        assert torch.allclose(saved_gpu["model"][name], value, rtol=REL, atol=ABS), name
    # GPU → CPU and CPU → GPU (map_location puts the tensors on the device)
    from_gpu = run_and_save("cpu", tmp_path, tmp_path / "a.h5", resume=saved_gpu)
    onto_gpu = cstorch.load(on_cpu, map_location=str(DEVICE))
    assert {t.device for t in onto_gpu["model"].values()} == {DEVICE}
    from_cpu = run_and_save(target, tmp_path, tmp_path / "b.h5", resume=onto_gpu)
    close(from_gpu, from_cpu)


# -- batches, closures, random numbers ----------------------------------------------------------------

def test_the_gpu_backend_streams_its_batches_on_the_gpu_and_closures_read_them_on_the_cpu(
        tmp_path):
    backend = backend_of("gpu", tmp_path)
    seen, read = [], []

    @cstorch.trace
    def step(batch):
        seen.append({t.device for t in batch})
        return batch[0] * 2

    @cstorch.step_closure
    def keep(out):
        read.append(out)

    batches = regression_batches(3)
    for batch in executor_of(batches):
        keep(step(batch))
    assert seen == [{DEVICE}] * 3
    assert all(t.device.type == "cpu" for t in read)
    for got, (x, _) in zip(read, batches):
        assert torch.equal(got, x * 2)
    backend.shutdown()


def dropout_run(target, tmp_path, seed=0, steps=8, resume=None, checkpoint_at=4):
    """Forward and backward of a dropout MLP; with ``resume`` the weights, optimizer and random
    stream come from a checkpoint dict. Returns the losses and what the checkpoint held."""
    torch.manual_seed(seed)
    backend = backend_of(target, tmp_path)
    model = DropoutMLP()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.05)
    batches = regression_batches(steps)
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        cstorch.set_rng_state(resume["rng_state"])
        batches = batches[checkpoint_at:]
    losses, saved = [], {}

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((compiled(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.step_closure
    def keep(loss):
        losses.append(loss.item())

    @cstorch.checkpoint_closure
    def save(i):
        saved[i] = dict(model=cpu_values(model.state_dict()), optimizer=opt.state_dict(),
                        rng_state=cstorch.get_rng_state())

    for i, batch in enumerate(executor_of(batches, checkpoint_steps=checkpoint_at), 1):
        keep(step(batch))
        save(i)
    backend.shutdown()
    return losses, saved.get(checkpoint_at)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_dropout_follows_the_seed_and_a_resumed_run_draws_the_uninterrupted_runs_masks(
        target, tmp_path):
    full, saved = dropout_run(target, tmp_path)
    again, _ = dropout_run(target, tmp_path)
    other, _ = dropout_run(target, tmp_path, seed=1)
    assert full == again and full != other
    assert saved["rng_state"].dtype == torch.uint8
    resumed, _ = dropout_run(target, tmp_path, resume=saved)
    assert resumed == full[4:]  # one device, one machine: exact


def test_a_gpu_random_state_is_refused_by_the_cpu_backend_with_the_reason(tmp_path):
    _, saved = dropout_run("gpu", tmp_path)
    backend = backend_of("cpu", tmp_path)
    with pytest.raises(ValueError, match="saved from another device's generator"):
        cstorch.set_rng_state(saved["rng_state"])
    backend.shutdown()


# -- the documentation's examples --------------------------------------------------------------------

def example(script, *args, cwd):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def example_accuracy(backend_args, tmp_path) -> float:
    run = tmp_path / "_".join(backend_args).replace("-", "")
    example("train.py", *backend_args, "--artifact-dir", str(run), "--log-every", "100",
            cwd=tmp_path)
    text = example("evaluate.py", *backend_args, "--artifact-dir", str(run),
                   "--checkpoint-dir", str(run / "checkpoints"), cwd=tmp_path)
    line = next(ln for ln in text.splitlines() if ln.startswith("Eval Accuracy:"))
    return float(line.split(":")[1])


@pytest.mark.slow
@pytest.mark.parametrize("backend_args", [("--backend", "GPU"),
                                          ("--backend", "CSX", "--device", "cuda", "--in-process")],
                         ids=["gpu", "csx_cuda"])
def test_the_examples_train_and_evaluate_to_the_cpu_backends_accuracy(backend_args, tmp_path):
    cpu = example_accuracy(("--backend", "CPU"), tmp_path)
    got = example_accuracy(backend_args, tmp_path)
    assert cpu >= 0.95
    # 300 SGD steps in float32 on other hardware: the weights differ by rounding, which may
    # flip a prediction near the decision boundary; 1% of the test set allows a few
    assert abs(got - cpu) <= 0.01, (got, cpu)
