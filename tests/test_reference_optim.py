"""cstream.optim against the committed run of the real ``cerebras.pytorch`` 2.10
(``tests/reference/gen_optim.py`` wrote ``fixtures/optim.json``; ``make reference`` reruns it).

Every case: the weights after each of 7 steps within the float32 bound of
``reference/tolerance.py`` (the fixtures come from another CPU and torch version), eagerly and
traced on CSX;
the real package's ``state_dict()`` after 4 steps loaded into cstream continues the run; cstream's
``state_dict()`` has the real one's layout (names, shapes, dtypes, group keys and their types).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import cstream as cstorch
from reference.tolerance import assert_tensor_close

# compares with numbers another program made on another CPU (make test reruns these under
# other float kernels: ATEN_CPU_CAPABILITY / MKL_CBWR)
pytestmark = pytest.mark.cross_cpu

FIXTURE = json.loads((pathlib.Path(__file__).parent / "reference" / "fixtures"
                      / "optim.json").read_text())
CASES = FIXTURE["cases"]


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


def assert_close(ours, expected, step, what):
    assert_tensor_close(ours, decode(expected, ours), step, what)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_step_equals_the_reference_eagerly(case):
    model = make_model(case["bias"])
    opt = getattr(cstorch.optim, case["name"])(model.parameters(), **kwargs_of(case))
    for step, (ours, theirs) in enumerate(zip(train_eagerly(opt, model, batches()),
                                              case["steps"]), 1):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_close(a, b, step, f"step {step}, parameter {i}")


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
            assert_close(a, b, step, f"step {step}, parameter {i}")


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


TRACED_CASES = list({c["name"]: c for c in CASES}.values())  # the last (richest) case of each


@pytest.mark.parametrize("case", TRACED_CASES, ids=case_id)
def test_every_step_equals_the_reference_traced_on_csx(case):
    backend = cstorch.backend("CSX", in_process=True)
    with backend.device:
        model = make_model(case["bias"])
    compiled = cstorch.compile(model, backend)
    opt = getattr(cstorch.optim, case["name"])(model.parameters(), **kwargs_of(case))
    weights = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        opt.zero_grad()
        torch.nn.functional.mse_loss(compiled(x), y).backward()
        opt.step()
        return tuple(p.detach() * 1 for p in model.parameters())

    @cstorch.step_closure
    def record(*params):
        weights.append([p.to("cpu").clone() for p in params])

    data = batches()
    for batch in cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(lambda: data), num_steps=len(data)):
        record(*step(batch))
    backend.shutdown()
    assert len(weights) == len(case["steps"])
    for n, (ours, theirs) in enumerate(zip(weights, case["steps"]), 1):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_close(a, b, n, f"traced step {n}, parameter {i}")


def test_every_signature_has_the_references_names_and_defaults():
    import inspect

    for name, params in FIXTURE["signatures"].items():
        ours = [[n, None if p.default is inspect.Parameter.empty else repr(p.default)]
                for n, p in inspect.signature(getattr(cstorch.optim, name).__init__)
                .parameters.items() if n not in ("self", "params")]
        assert ours == params, name


# -- Muon: 2.10's step raises (docs/reference.md, Deviations); its Newton-Schulz function and
# its first step (the momentum buffer still zero) with the call repaired are the reference
def test_muon_newton_schulz_equals_the_reference():
    from cstream.optim.muon import zeropower_via_newtonschulz5

    for entry in FIXTURE["muon"]["newton_schulz"]:
        G = torch.tensor(entry["G"]).reshape(entry["shape"])
        X = zeropower_via_newtonschulz5(G, steps=entry["steps"])
        assert X.dtype == torch.bfloat16
        # bfloat16 keeps 8 significant bits: another CPU's matmul (fp32 or AMX accumulation)
        # may round an element to the neighbouring bfloat16, one ulp (2**-7 relative) away
        torch.testing.assert_close(X.float(), torch.tensor(entry["X"]).reshape(entry["shape"]),
                                   rtol=2.0 ** -7, atol=2.0 ** -7)


@pytest.mark.parametrize("kwargs", list(FIXTURE["muon"]["first_step"]))
def test_muons_first_step_equals_the_reference(kwargs):
    model = make_model(bias=False)
    opt = cstorch.optim.Muon(model.parameters(), **json.loads(kwargs))
    ours = train_eagerly(opt, model, batches()[:1])[0]
    for i, (a, b) in enumerate(zip(ours, FIXTURE["muon"]["first_step"][kwargs])):
        assert_close(a, b, 1, f"parameter {i}")


def test_muon_keeps_its_momentum_buffer_and_refuses_1d_parameters():
    model = make_model(bias=False)
    opt = cstorch.optim.Muon(model.parameters(), momentum=0.9, nesterov=False)
    first = train_eagerly(opt, model, batches()[:1])
    buf = opt.state[model[0].weight]["momentum_buffer"]
    torch.testing.assert_close(buf, 0.1 * model[0].weight.grad)
    train_eagerly(opt, model, batches()[1:2])
    assert not torch.equal(buf, 0.1 * model[0].weight.grad)  # 0.9 * old + 0.1 * new
    assert first
    with pytest.raises(ValueError, match=r"parameter 1 of group 0 has shape \(4,\).*another "
                                         r"optimizer"):
        cstorch.optim.Muon(make_model().parameters())
