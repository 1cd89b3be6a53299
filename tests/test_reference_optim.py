"""cstream.optim against the committed run of the real ``cerebras.pytorch`` 2.10
(``tests/reference/gen_optim.py`` wrote ``fixtures/optim.json``; ``make reference`` reruns it).

Every case: the weights after each of 7 steps within 1e-6 relative, eagerly and traced on CSX;
the real package's ``state_dict()`` after 4 steps loaded into cstream continues the run; cstream's
``state_dict()`` has the real one's layout (names, shapes, dtypes, group keys and their types).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import cstream as cstorch

FIXTURE = json.loads((pathlib.Path(__file__).parent / "reference" / "fixtures"
                      / "optim.json").read_text())
CASES = FIXTURE["cases"]
RTOL = 1e-6


def case_id(case):
    kw = ",".join(f"{k}={v}" for k, v in case["kwargs"].items())
    return f"{case['name']}({kw})"


def decode(values, like):
    return torch.tensor(values, dtype=torch.float32).reshape(like.shape)


def make_model(bias=True):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4, bias=bias), torch.nn.Tanh(),
                                torch.nn.Linear(4, 2, bias=bias))
    initial = FIXTURE["params0" if bias else "params0_nobias"]
    with torch.no_grad():
        for p, values in zip(model.parameters(), initial):
            p.copy_(decode(values, p))
    return model


def batches():
    return [(torch.tensor(x).reshape(5, 3), torch.tensor(y).reshape(5, 2))
            for x, y in FIXTURE["batches"]]


def kwargs_of(case):
    return {k: tuple(v) if isinstance(v, list) else v for k, v in case["kwargs"].items()}


def train_eagerly(opt, model, data):
    out = []
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out


def assert_close(ours, expected, what):
    want = decode(expected, ours)
    torch.testing.assert_close(ours, want, rtol=RTOL, atol=1e-9, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_step_equals_the_reference_eagerly(case):
    model = make_model(case["bias"])
    opt = getattr(cstorch.optim, case["name"])(model.parameters(), **kwargs_of(case))
    for step, (ours, theirs) in enumerate(zip(train_eagerly(opt, model, batches()),
                                              case["steps"]), 1):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_close(a, b, f"step {step}, parameter {i}")


def load_reference_state(opt, encoded):
    """The real package's state_dict (decoded from the fixture) loaded into ``opt``."""
    def value(v):
        if v["type"] == "Tensor":
            dtype = getattr(torch, v["dtype"])
            return torch.tensor(v["values"], dtype=dtype).reshape(v["shape"])
        if v["type"] in ("tuple", "list"):
            items = [value(x) for x in v["items"]]
            return tuple(items) if v["type"] == "tuple" else items
        return v["value"]

    opt.load_state_dict({
        "state": {int(i): {k: value(v) for k, v in s.items()}
                  for i, s in encoded["state"].items()},
        "param_groups": [{k: value(v) for k, v in g.items()} for g in encoded["param_groups"]]})


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_references_state_dict_after_4_steps_loads_and_the_run_continues(case):
    k = FIXTURE["k"]
    model = make_model(case["bias"])
    with torch.no_grad():
        for p, values in zip(model.parameters(), case["steps"][k - 1]):
            p.copy_(decode(values, p))
    # another optimizer's options: everything must come from the loaded state
    opt = getattr(cstorch.optim, case["name"])(model.parameters(), **kwargs_of(case))
    load_reference_state(opt, case["state_k"])
    ours = train_eagerly(opt, model, batches()[k:])
    for step, (a_step, b_step) in enumerate(zip(ours, case["steps"][k:]), k + 1):
        for i, (a, b) in enumerate(zip(a_step, b_step)):
            assert_close(a, b, f"step {step}, parameter {i}")


def layout(sd):
    """Names, Python types, dtypes and shapes of a state_dict (decoded or live), and the
    param groups' non-tensor values."""
    def describe(v):
        if isinstance(v, dict) and "type" in v:  # a fixture entry
            if v["type"] == "Tensor":
                return ("Tensor", v["dtype"], tuple(v["shape"]))
            if v["type"] in ("tuple", "list"):
                return (v["type"], tuple(describe(x) for x in v["items"]))
            return (v["type"], v["value"])
        if isinstance(v, torch.Tensor):
            return ("Tensor", str(v.dtype).replace("torch.", ""), tuple(v.shape))
        if isinstance(v, (tuple, list)):
            return (type(v).__name__, tuple(describe(x) for x in v))
        return (type(v).__name__, v)

    return ({str(i): {k: describe(v) for k, v in s.items()} for i, s in sd["state"].items()},
            [{k: describe(v) for k, v in g.items()} for g in sd["param_groups"]])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_state_dict_has_the_references_layout(case):
    model = make_model(case["bias"])
    opt = getattr(cstorch.optim, case["name"])(model.parameters(), **kwargs_of(case))
    train_eagerly(opt, model, batches()[:FIXTURE["k"]])
    ours_state, ours_groups = layout(opt.state_dict())
    ref_state, ref_groups = layout(case["state_k"])
    assert ours_groups == ref_groups
    assert ours_state.keys() == ref_state.keys()
    for i in ref_state:
        assert list(ours_state[i].items()) == list(ref_state[i].items()), i
