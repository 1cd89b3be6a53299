"""Reference loss-scaling runs of ``cerebras.pytorch.amp.GradScaler`` (run by generate.py).

The real GradScaler follows its loss-scaling rules only on a CSX backend (on its CPU backend
``scale()`` returns the loss unscaled and ``state_dict()`` is empty), and ``update()`` needs the
amp handle the CSX backend installs. Here the scaler's backend is the CPU backend seen as a CSX
one (``backend_type`` CSX, no-op name scopes and output marks) and the handle is the package's
own ``NoOpHandle``: the CSX code path, run eagerly.

Writes ``fixtures/amp.json``: per scenario the scaler's arguments, the optimizer, the loss
factor of each step (``inf``/``nan``/``1e30`` inject overflows: the last one overflows only the
squared norm), and after each step the scale, the counters and the weights.
"""

from __future__ import annotations

import contextlib
import json

import torch

from reference.gen_optim import f32
from reference.realpkg import cpu_backend

FACTORS = {"ok": 1.0, "inf": float("inf"), "nan": float("nan"), "huge": 1e30}

SCENARIOS = [
    dict(name="dynamic_tolerance_0", optimizer=("Adam", dict(lr=0.1)),
         scaler=dict(loss_scale="dynamic", init_scale=8.0, steps_per_increase=2,
                     overflow_tolerance=0.0),
         pattern="ok inf ok ok huge nan ok ok ok ok ok ok"),
    dict(name="dynamic_tolerance_0.3", optimizer=("SGD", dict(lr=0.1, momentum=0.9)),
         scaler=dict(loss_scale="dynamic", init_scale=64.0, steps_per_increase=3,
                     overflow_tolerance=0.3),
         pattern="ok inf ok ok inf ok inf inf ok ok ok ok ok"),
    dict(name="dynamic_defaults", optimizer=("AdamW", dict(lr=0.05, weight_decay=0.1)),
         scaler=dict(loss_scale="dynamic", overflow_tolerance=0.0),
         pattern="ok ok inf ok ok ok"),
    dict(name="dynamic_clamped", optimizer=("SGD", dict(lr=0.1)),
         scaler=dict(loss_scale="dynamic", init_scale=4.0, steps_per_increase=1,
                     min_loss_scale=1.0, max_loss_scale=16.0, overflow_tolerance=0.0),
         pattern="ok ok ok ok ok ok inf inf inf inf inf ok ok"),
    dict(name="dynamic_max_gradient_norm", optimizer=("Adagrad", dict(lr=0.1)),
         scaler=dict(loss_scale="dynamic", init_scale=2.0 ** 10, steps_per_increase=2,
                     overflow_tolerance=0.0, max_gradient_norm=0.05),
         pattern="ok ok inf ok ok ok"),
    dict(name="static_128", optimizer=("SGD", dict(lr=0.1, momentum=0.5)),
         scaler=dict(loss_scale=128.0), pattern="ok ok ok ok"),
    dict(name="static_1", optimizer=("Adam", dict(lr=0.1)),
         scaler=dict(loss_scale=1.0), pattern="ok ok ok"),
    dict(name="dynamic_clip_norm", optimizer=("Adam", dict(lr=0.1)),
         scaler=dict(loss_scale="dynamic", init_scale=2.0 ** 12, steps_per_increase=2,
                     overflow_tolerance=0.0),
         step=dict(max_gradient_norm=0.1), pattern="ok inf ok ok ok"),
    dict(name="dynamic_clip_value", optimizer=("RMSprop", dict(lr=0.01)),
         scaler=dict(loss_scale="dynamic", init_scale=2.0 ** 12, steps_per_increase=2,
                     overflow_tolerance=0.0),
         step=dict(max_gradient_value=0.05), pattern="ok ok inf ok ok"),
]


def make_model():
    g = torch.Generator().manual_seed(7)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    batches = [(torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g))
               for _ in range(16)]
    return model, batches


class _CsxView:
    """The scaler's view of the CPU backend: a CSX one, without name scopes or output marks."""

    def __init__(self, impl, backend_type):
        self._impl = impl
        self.backend_type = backend_type

    def __getattr__(self, name):
        return getattr(self._impl, name)

    def name_scope(self, name):
        return contextlib.nullcontext()

    def mark_output(self, *args, **kwargs):
        pass


def scaler_state(gs) -> dict:
    def num(v):
        return float(v) if isinstance(v, (float, int)) else f32(v)[0] if v.is_floating_point() \
            else int(v)

    out = {k: num(v) for k, v in gs.state_dict().items()}
    out["num_skipped"] = int(gs.get_num_skipped_steps())
    out["non_clamped_scale"] = num(gs.get_non_clamped_scale())
    return out


def run(cstorch, scenario) -> dict:
    from cerebras.pytorch.backend import BackendType

    model, batches = make_model()
    name, kwargs = scenario["optimizer"]
    opt = getattr(cstorch.optim, name)(model.parameters(), **kwargs)
    gs = cstorch.amp.GradScaler(**scenario["scaler"])
    gs.backend = _CsxView(gs.backend, BackendType.CSX)
    steps, scaled = [], []
    for (x, y), word in zip(batches, scenario["pattern"].split()):
        loss = torch.nn.functional.mse_loss(model(x), y) * FACTORS[word]
        scaled.append(float(gs.scale(loss).detach()))
        cstorch.amp.optimizer_step(loss, opt, gs, **scenario.get("step", {}))
        steps.append({"params": [f32(p) for p in model.parameters()], **scaler_state(gs)})
    return {**scenario, "scaled_losses": scaled, "steps": steps}


def main(out):
    import cerebras.pytorch as cstorch
    from cerebras.pytorch.amp._amp_state import _amp_state
    from cerebras.pytorch.amp.handle import NoOpHandle

    cpu_backend(cstorch)
    _amp_state.handle = NoOpHandle()
    model, batches = make_model()
    defaults = cstorch.amp.GradScaler("dynamic")
    fixture = {
        "version": cstorch.__version__, "factors": FACTORS,
        "params0": [f32(p) for p in model.parameters()],
        "batches": [[f32(x), f32(y)] for x, y in batches],
        "default_dynamic": {"init_scale": float(defaults._loss_scale),
                            "max_loss_scale": defaults._max_loss_scale,
                            "min_loss_scale": defaults._min_loss_scale,
                            "steps_per_increase": defaults._steps_per_increase,
                            "overflow_tolerance": defaults._overflow_tolerance},
        "scenarios": [run(cstorch, s) for s in SCENARIOS],
    }
    (out / "amp.json").write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"  amp.json: {len(SCENARIOS)} scenarios")
