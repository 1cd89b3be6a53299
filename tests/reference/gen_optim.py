"""Reference trajectories of every ``cerebras.pytorch.optim`` optimizer (run by generate.py).

Writes ``fixtures/optim.json``: the initial weights and batches of a 3-4-2 MLP (float32), and per
case (optimizer, keyword arguments) the weights after each of ``STEPS`` steps, the optimizer's
``state_dict()`` after ``K`` steps, and the signature defaults of each class. float32 values are
stored as the shortest decimal that reads back to the same float32.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import torch

from reference.realpkg import cpu_backend

STEPS, K = 7, 4

CASES = [
    ("SGD", dict(lr=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, weight_decay=0.01, maximize=True)),
    ("Adam", dict()),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.01, betas=(0.8, 0.99), eps=1e-3)),
    ("AdamW", dict()),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, correct_bias=False)),
    ("AdamW", dict(lr=0.01, amsgrad=True, weight_decay=0.05)),
    ("Adagrad", dict()),
    ("Adagrad", dict(lr=0.05, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1,
                     maximize=True)),
    ("RMSprop", dict()),
    ("RMSprop", dict(lr=0.01, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, centered=True, weight_decay=0.01)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, weight_decay=0.01, maximize=True)),
    ("Adamax", dict()),
    ("Adamax", dict(lr=0.01, weight_decay=0.01, maximize=True)),
    ("ASGD", dict()),
    ("ASGD", dict(lr=0.01, t0=2, lambd=0.1, weight_decay=0.01, maximize=True)),
    ("NAdam", dict()),
    ("NAdam", dict(lr=0.01, weight_decay=0.01, momentum_decay=0.01)),
    ("RAdam", dict()),
    ("RAdam", dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.01)),
    ("Rprop", dict()),
    ("Rprop", dict(lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-5, 0.02))),
    ("Lamb", dict()),
    ("Lamb", dict(lr=0.01, weight_decay=0.01)),
    ("Lamb", dict(lr=0.01, adam=True)),
    ("Lion", dict()),
    ("Lion", dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)),
    ("Adafactor", dict(lr=0.01)),
    ("Adafactor", dict(lr=0.01, scale_parameter=False, weight_decay=0.01, decay_rate=-0.5)),
]

CLASSES = ["SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "Adamax", "ASGD", "NAdam",
           "RAdam", "Rprop", "Lamb", "Lion", "Adafactor", "Muon"]


def f32(t: torch.Tensor) -> list:
    """A float32 tensor as a flat list of the shortest decimals that read back exactly."""
    return [float(np.format_float_positional(v, unique=True))
            for v in t.detach().to(torch.float32).reshape(-1).numpy()]


def encode_tensor(t: torch.Tensor) -> dict:
    values = (f32(t) if t.dtype.is_floating_point else t.reshape(-1).tolist())
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "values": values}


def encode_value(v):
    """A param-group or state value with its Python type, so layouts can be compared."""
    if isinstance(v, torch.Tensor):
        return {"type": "Tensor", **encode_tensor(v)}
    if isinstance(v, (tuple, list)):
        return {"type": type(v).__name__, "items": [encode_value(x) for x in v]}
    if isinstance(v, set):
        return {"type": "set", "items": sorted(map(str, v))}
    return {"type": type(v).__name__, "value": v}


def encode_state_dict(sd: dict) -> dict:
    return {"state": {str(i): {k: encode_value(v) for k, v in s.items()}
                      for i, s in sd["state"].items()},
            "param_groups": [{k: encode_value(v) for k, v in g.items()}
                             for g in sd["param_groups"]]}


def make_data(seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4, bias=bias), torch.nn.Tanh(),
                                torch.nn.Linear(4, 2, bias=bias))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    g = torch.Generator().manual_seed(seed + 1)  # the same batches with or without biases
    batches = [(torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g))
               for _ in range(STEPS)]
    return model, batches


def train(opt, model, batches, on_step=None):
    """Plain training steps; returns the weights after each step."""
    out = []
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out.append([f32(p) for p in model.parameters()])
        if on_step is not None:
            on_step(i + 1)
    return out


def run_case(cstorch, name, kwargs, bias=True, steps=STEPS):
    model, batches = make_data(bias=bias)
    opt = getattr(cstorch.optim, name)(model.parameters(), **kwargs)
    saved = {}

    def on_step(n):
        if n == K:
            saved["state"] = encode_state_dict(opt.state_dict())

    trajectory = train(opt, model, batches[:steps], on_step)
    return {"name": name, "kwargs": kwargs, "bias": bias, "steps": trajectory,
            "state_k": saved.get("state")}


def signature(cls) -> list:
    out = []
    for n, p in inspect.signature(cls.__init__).parameters.items():
        if n in ("self", "params"):
            continue
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([n, default])
    return out


def muon_reference(cstorch) -> dict:
    """2.10's ``Muon.step`` calls ``_zeropower_via_newtonschulz5`` as a method although the
    function takes no ``self``: every step raises. Called through the class (as the function it
    is), it gives the Newton-Schulz reference; with that call repaired, the first step (zero
    momentum buffer, so 2.10 not keeping the buffer makes no difference yet) is the reference of
    the update."""
    muon = cstorch.optim.Muon
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(4, 3, generator=g), torch.randn(2, 5, generator=g)]
    ns = [{"G": f32(G), "shape": list(G.shape), "steps": s,
           "X": f32(muon._zeropower_via_newtonschulz5(G, steps=s).float())}
          for G in grads for s in (1, 5)]
    model, batches = make_data(bias=False)
    try:
        opt = muon(model.parameters(), lr=0.02)
        train(opt, model, batches[:1])
        raise AssertionError("Muon.step ran: the fixture's note about 2.10 is out of date")
    except TypeError as e:
        crash = f"{type(e).__name__}: {e}"
    plain = muon._zeropower_via_newtonschulz5
    muon._zeropower_via_newtonschulz5 = staticmethod(plain)
    try:
        first = {}
        for kw in (dict(), dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=False)):
            model, batches = make_data(bias=False)
            opt = muon(model.parameters(), **kw)
            first[json.dumps(kw, sort_keys=True)] = train(opt, model, batches[:1])[0]
    finally:
        muon._zeropower_via_newtonschulz5 = plain
    return {"crash": crash, "newton_schulz": ns, "first_step": first}


def main(out):
    import cerebras.pytorch as cstorch

    cpu_backend(cstorch)
    model, batches = make_data()
    nobias, _ = make_data(bias=False)
    fixture = {
        "version": cstorch.__version__, "steps": STEPS, "k": K,
        "params0": [f32(p) for p in model.parameters()],
        "params0_nobias": [f32(p) for p in nobias.parameters()],
        "batches": [[f32(x), f32(y)] for x, y in batches],
        "signatures": {n: signature(getattr(cstorch.optim, n)) for n in CLASSES},
        "cases": [run_case(cstorch, n, kw) for n, kw in CASES],
        "muon": muon_reference(cstorch),
    }
    (out / "optim.json").write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"  optim.json: {len(CASES)} cases")
