"""cstream.optim and cstream.amp against torch and against the papers' update rules."""

from __future__ import annotations

import math

import pytest
import torch

import cstream as cstorch
from cstream.optim import lr_scheduler as lrs


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batches(n=100, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g)) for _ in range(n)]


def run(opt_factory, model, data):
    opt = opt_factory(model.parameters())
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# where cerebras.pytorch 2.10's rule is torch's (with torch's eps given where 2.10's default
# differs); the others (Adam, AdamW, NAdam, SGD with dampening, centered RMSprop with momentum,
# Lamb) and every case here are checked against the real package itself in
# test_reference_optim.py
TORCH_PAIRS = {
    "SGD": [dict(lr=0.05), dict(lr=0.05, momentum=0.9),
            dict(lr=0.05, momentum=0.9, nesterov=True), dict(lr=0.05, weight_decay=0.01)],
    "Adagrad": [dict(lr=0.05, eps=1e-10), dict(lr=0.05, lr_decay=0.01, weight_decay=0.01,
                                               initial_accumulator_value=0.1, eps=1e-10)],
    "RMSprop": [dict(lr=0.01), dict(lr=0.01, centered=True), dict(lr=0.01, weight_decay=0.01)],
    "Adadelta": [dict(lr=1.0), dict(lr=0.5, rho=0.8, weight_decay=0.01)],
    "ASGD": [dict(lr=0.01), dict(lr=0.01, t0=20, weight_decay=0.01)],
    "Rprop": [dict(lr=0.01), dict(lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-5, 1.0))],
}


@pytest.mark.parametrize("name,kwargs", [(n, k) for n, ks in TORCH_PAIRS.items() for k in ks])
def test_optimizer_matches_torch_over_100_steps(name, kwargs):
    data = batches()
    ours = run(lambda p: getattr(cstorch.optim, name)(p, **kwargs), make_model(), data)
    theirs = run(lambda p: getattr(torch.optim, name)(p, foreach=False, **kwargs),
                 make_model(), data)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("name,kwargs", [
    ("Adam", dict(lr=0.01)), ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, amsgrad=True))])
def test_adam_follows_its_rule_with_eps_outside_the_bias_correction(name, kwargs):
    """2.10's Adam: ``m / (sqrt(v) + eps) * sqrt(1 - b2**t) / (1 - b1**t)``, eps 1e-6, decoupled
    weight decay for AdamW; torch's puts eps after the correction of ``v``."""
    data, eps, (b1, b2) = batches(30), 1e-6, (0.9, 0.999)
    ours = run(lambda p: getattr(cstorch.optim, name)(p, **kwargs), make_model(), data)
    model = make_model()
    m = [torch.zeros_like(p) for p in model.parameters()]
    v = [torch.zeros_like(p) for p in model.parameters()]
    peak = [torch.zeros_like(p) for p in model.parameters()]
    for t, (x, y) in enumerate(data, 1):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p, mi, vi, pk in zip(model.parameters(), m, v, peak):
                mi.copy_(b1 * mi + (1 - b1) * p.grad)
                vi.copy_(b2 * vi + (1 - b2) * p.grad ** 2)
                pk.copy_(torch.maximum(pk, vi))
                denom = (pk if kwargs.get("amsgrad") else vi).sqrt() + eps
                step = mi / denom * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p.sub_(kwargs["lr"] * (step + kwargs.get("weight_decay", 0.0) * p))
    for a, b in zip(ours, model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_lion_follows_the_papers_update_rule():
    data, lr, b1, b2, wd = batches(30), 1e-3, 0.9, 0.99, 0.1
    ours = run(lambda p: cstorch.optim.Lion(p, lr=lr, betas=(b1, b2), weight_decay=wd),
               make_model(), data)
    model = make_model()
    m = [torch.zeros_like(p) for p in model.parameters()]
    for x, y in data:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p, mi in zip(model.parameters(), m):
                c = b1 * mi + (1 - b1) * p.grad          # interpolate
                p.mul_(1 - lr * wd)                      # decoupled weight decay
                p.sub_(lr * torch.sign(c))               # sign update
                mi.copy_(b2 * mi + (1 - b2) * p.grad)    # momentum update
    for a, b in zip(ours, model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_lamb_follows_2_10s_rule():
    """The paper's layer-wise trust ratio ``||w|| / ||r||`` with 2.10's choices: no bias
    correction of the moments, ``||w||`` clipped to 10."""
    data, lr, b1, b2, eps, wd = batches(30), 1e-2, 0.9, 0.999, 1e-6, 0.01
    ours = run(lambda p: cstorch.optim.Lamb(p, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd),
               make_model(), data)
    model = make_model()
    m = [torch.zeros_like(p) for p in model.parameters()]
    v = [torch.zeros_like(p) for p in model.parameters()]
    for x, y in data:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p, mi, vi in zip(model.parameters(), m, v):
                mi.copy_(b1 * mi + (1 - b1) * p.grad)
                vi.copy_(b2 * vi + (1 - b2) * p.grad ** 2)
                r = mi / (vi.sqrt() + eps) + wd * p
                w_norm = min(float(p.norm()), 10.0)
                trust = w_norm / r.norm() if w_norm > 0 and r.norm() > 0 else 1.0
                p.sub_(lr * trust * r)
    for a, b in zip(ours, model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_adafactor_follows_the_papers_update_rule():
    data, lr, eps1, eps2, d, decay = batches(30), 1e-2, 1e-30, 1e-3, 1.0, -0.8
    ours = run(lambda p: cstorch.optim.Adafactor(p, lr=lr), make_model(), data)
    model = make_model()
    state = {}
    for t, (x, y) in enumerate(data, 1):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        beta2 = 1 - t ** decay
        with torch.no_grad():
            for p in model.parameters():
                g2 = p.grad ** 2 + eps1
                if p.dim() == 2:   # factored second moment: row and column means
                    R, C = state.get((p, "R"), 0), state.get((p, "C"), 0)
                    R = beta2 * R + (1 - beta2) * g2.mean(1)
                    C = beta2 * C + (1 - beta2) * g2.mean(0)
                    state[(p, "R")], state[(p, "C")] = R, C
                    V = torch.outer(R, C) / R.mean()
                else:
                    V = beta2 * state.get((p, "V"), 0) + (1 - beta2) * g2
                    state[(p, "V")] = V
                U = p.grad / V.sqrt()
                U = U / max(1.0, float(U.pow(2).mean().sqrt()) / d)   # update clipping
                alpha = lr * max(eps2, float(p.pow(2).mean().sqrt()))  # relative scale
                p.sub_(alpha * U)
    for a, b in zip(ours, model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_configure_optimizer_is_case_insensitive_and_lists_valid_names_and_arguments():
    p = [torch.nn.Parameter(torch.ones(2))]
    assert type(cstorch.optim.configure_optimizer("adamw", p, lr=0.1)).__name__ == "AdamW"
    with pytest.raises(ValueError, match="unknown optimizer_type 'Adamm'.*Adam, AdamW"):
        cstorch.optim.configure_optimizer("Adamm", p)
    with pytest.warns(UserWarning, match=r"SGD got 1 unexpected and unused parameters: "
                                         r"\['momentun'\]; left out. Did you mean 'momentum'"):
        sgd = cstorch.optim.configure_optimizer("SGD", p, lr=0.1, momentun=0.9)
    assert sgd.param_groups[0]["momentum"] == 0.0  # the misspelt value is not taken
    with pytest.warns(UserWarning, match=r"Adam got 1 unexpected and unused parameters: "
                                         r"\['correct_bias'\]"):
        adam = cstorch.optim.configure_optimizer("adam", p, lr=0.1, correct_bias=True, eps=1e-8)
    assert type(adam).__name__ == "Adam" and adam.param_groups[0]["eps"] == 1e-8


def test_state_created_outside_preinitialize_is_refused():
    class Bad(cstorch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(lr=0.1))

        def preinitialize(self):
            pass

        @torch.no_grad()
        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    self.state[p]["velocity"] = torch.zeros_like(p)

    w = torch.nn.Parameter(torch.ones(2))
    opt = Bad([w])
    w.sum().backward()
    with pytest.raises(RuntimeError, match="created the state tensor 'velocity'.*preinitialize"):
        opt.step()


class HeavyBall(cstorch.optim.Optimizer):
    """Momentum SGD written with the base class's loop: its state and one parameter's update."""

    def __init__(self, params, lr, momentum):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def initial_state(self, group, p):
        return {"momentum_buffer": cstorch.zeros_like(p)}

    def update(self, group, p, state):
        buf = state["momentum_buffer"]
        buf.mul_(group["momentum"]).add_(p.grad)
        p.add_(buf, alpha=-group["lr"])


def test_an_optimizer_giving_its_state_and_one_parameters_update_steps_every_parameter():
    data = batches(20)
    got = run(lambda p: HeavyBall(p, lr=0.05, momentum=0.9), make_model(), data)
    want = run(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), make_model(), data)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("closure_enables_grad", [False, True])
def test_step_returns_the_closures_loss_computed_with_autograd_as_the_class_says(
        closure_enables_grad):
    model = make_model()
    opt = type("Ball", (HeavyBall,), {"closure_enables_grad": closure_enables_grad})(
        model.parameters(), lr=0.05, momentum=0.9)
    x, y = batches(1)[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    loss = opt.step(lambda: torch.nn.functional.mse_loss(model(x), y))
    assert loss.requires_grad is closure_enables_grad
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    assert all(list(st) == ["momentum_buffer"] for st in sd["state"].values())


def test_an_optimizer_without_update_or_step_says_which_to_define():
    class NoUpdate(cstorch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, dict(lr=0.1))

    w = torch.nn.Parameter(torch.ones(2))
    opt = NoUpdate([w])
    w.sum().backward()
    with pytest.raises(NotImplementedError, match=r"NoUpdate defines neither step\(\) nor "
                       r"update\(\); define update\(group, p, state\)"):
        opt.step()


def test_optimizer_state_dict_round_trips_in_the_reference_layout():
    model = make_model()
    opt = cstorch.optim.Adam(model.parameters(), lr=0.01)
    run(lambda p: opt, model, batches(3))
    sd = opt.state_dict()
    assert list(sd["state"][0]) == ["exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"]
    assert float(sd["state"][0]["beta1_power"]) == pytest.approx(0.9 ** 4)  # for step 4
    assert sd["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert type(sd["param_groups"][0]["lr"]) is float
    other = cstorch.optim.Adam(make_model(5).parameters(), lr=0.5)
    other.load_state_dict(sd)
    assert other.param_groups[0]["lr"] == 0.01
    assert torch.equal(other.state_dict()["state"][2]["exp_avg"], sd["state"][2]["exp_avg"])


def test_a_torch_adam_state_with_a_step_count_loads_as_beta_powers():
    model = make_model()
    theirs = torch.optim.AdamW(model.parameters(), lr=0.01)
    run(lambda p: theirs, model, batches(3))
    ours = cstorch.optim.AdamW(model.parameters(), lr=0.5)
    ours.load_state_dict(theirs.state_dict())
    st = ours.state_dict()["state"][1]
    assert sorted(st) == ["beta1_power", "beta2_power", "exp_avg", "exp_avg_sq"]
    assert float(st["beta2_power"]) == pytest.approx(0.999 ** 3)
    assert ours.param_groups[0]["lr"] == 0.01


def test_a_state_of_another_layout_is_refused_naming_what_differs():
    sgd = cstorch.optim.SGD(make_model().parameters(), lr=0.1, momentum=0.9)
    run(lambda p: sgd, make_model(), batches(1))
    sd = cstorch.optim.SGD(make_model().parameters(), lr=0.1, momentum=0.9).state_dict()
    sd["state"][0] = {"momentum_buffer": sd["state"][0]["momentum_buffer"], "extra": 1}
    with pytest.raises(ValueError, match=r"parameter 0 holds \['extra', 'momentum_buffer'\], "
                                         r"this optimizer keeps \['momentum_buffer'\]"):
        sgd.load_state_dict(sd)


def test_configure_optimizer_takes_the_model_zoos_optimizer_section():
    p = [torch.nn.Parameter(torch.ones(2))]
    with pytest.warns(UserWarning, match="initial_loss_scale, max_gradient_norm configure other"):
        opt = cstorch.optim.configure_optimizer(
            optimizer_type="adamw", params=p, betas=[0.9, 0.95], eps=1e-8, max_gradient_norm=1.0,
            learning_rate=[{"scheduler": "Linear", "initial_learning_rate": 0.0,
                            "end_learning_rate": 6e-4, "total_iters": 10}],
            weight_decay=0.01, initial_loss_scale=2.0 ** 31)
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["eps"]) == (0.1, 0.01, 1e-8)
    assert cstorch.optim.configure_optimizer("SGD", p, learning_rate=0.02).param_groups[0][
        "lr"] == 0.02
    with pytest.raises(ValueError, match="learning_rate or lr"):
        cstorch.optim.configure_optimizer("SGD", p, learning_rate=0.02, lr=0.1)


# -- schedulers ----------------------------------------------------------------------------------
def _lrs(ours_factory, steps=300):
    opt = cstorch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    sched = ours_factory(opt)
    out = []
    for _ in range(steps):
        out.append(float(sched.get_last_lr()[0]))
        sched.step()
    return out


def _torch_lrs(factory, base=1.0, steps=300):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=base)
    sched = factory(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


TORCH_SCHEDULES = {
    "StepLR": (lambda o: lrs.StepLR(o, 0.5, step_size=30, gamma=0.7),
               lambda o: torch.optim.lr_scheduler.StepLR(o, 30, 0.7), 0.5),
    "MultiStepLR": (lambda o: lrs.MultiStepLR(o, 0.5, milestones=[50, 120, 200], gamma=0.3),
                    lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [50, 120, 200], 0.3), 0.5),
    "CosineAnnealingLR": (lambda o: lrs.CosineAnnealingLR(o, 0.5, T_max=100, eta_min=0.01),
                          lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 100, 0.01), 0.5),
    "CosineAnnealingWarmRestarts": (
        lambda o: lrs.CosineAnnealingWarmRestarts(o, 0.5, T_0=20, T_mult=2, eta_min=0.01),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 20, 2, 0.01), 0.5),
    "CosineAnnealingWarmRestarts_T1": (
        lambda o: lrs.CosineAnnealingWarmRestarts(o, 0.5, T_0=30),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 30), 0.5),
    "LambdaLR": (lambda o: lrs.LambdaLR(o, 0.5, lr_lambda=lambda s: 1.0 / (1.0 + 0.01 * s)),
                 lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1.0 + 0.01 * s)),
                 0.5),
    "MultiplicativeLR": (lambda o: lrs.MultiplicativeLR(o, 0.5, coefficient=0.99),
                         lambda o: torch.optim.lr_scheduler.MultiplicativeLR(o, lambda s: 0.99),
                         0.5),
    "CyclicLR": (lambda o: lrs.CyclicLR(o, 0.01, 0.1, step_size_up=25, mode="triangular2"),
                 lambda o: torch.optim.lr_scheduler.CyclicLR(
                     o, 0.01, 0.1, step_size_up=25, mode="triangular2", cycle_momentum=False),
                 0.01),
    "OneCycleLR": (lambda o: lrs.OneCycleLR(o, 0.1 / 25, 0.1, total_steps=300),
                   lambda o: torch.optim.lr_scheduler.OneCycleLR(
                       o, 0.1, total_steps=300, cycle_momentum=False, three_phase=False), 0.1),
}


@pytest.mark.parametrize("name", sorted(TORCH_SCHEDULES))
def test_scheduler_matches_torch_at_every_one_of_300_steps(name):
    ours_f, theirs_f, base = TORCH_SCHEDULES[name]
    ours = _lrs(ours_f)
    theirs = _torch_lrs(theirs_f, base)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        # the schedules compute in float32, as the real package does (tests/
        # test_reference_sched.py holds them to its figures); torch's in float64: over 300
        # steps float32's rounding of the step's factor (0.99 ** 300, pi * 270 / 100) reaches
        # a few 1e-6
        assert a == pytest.approx(b, rel=5e-6, abs=1e-7), (i, a, b)


CLOSED_FORMS = {
    "ConstantLR": (lambda o: lrs.ConstantLR(o, 0.3), lambda s: 0.3),
    "LinearLR": (lambda o: lrs.LinearLR(o, 0.1, 0.5, 100),
                 lambda s: 0.1 + 0.4 * min(s, 100) / 100),
    "PolynomialLR": (lambda o: lrs.PolynomialLR(o, 0.5, 0.01, 200, power=2.0),
                     lambda s: 0.49 * (1 - min(s, 200) / 200) ** 2 + 0.01),
    "CosineDecayLR": (lambda o: lrs.CosineDecayLR(o, 0.5, 0.01, 200),
                      lambda s: 0.01 + 0.49 * 0.5 * (1 + math.cos(math.pi * min(s, 200) / 200))),
    "ExponentialLR": (lambda o: lrs.ExponentialLR(o, 0.5, 50, 0.5, staircase=True),
                      lambda s: 0.5 * 0.5 ** (s // 50)),
    "InverseExponentialTimeDecayLR": (  # step ** step_exponent / total_iters, as in 2.10
        lambda o: lrs.InverseExponentialTimeDecayLR(o, 0.5, 2, 300, 0.2),
        lambda s: 0.5 / (1 + 0.2 * s ** 2 / 300)),
    "InverseSquareRootDecayLR": (lambda o: lrs.InverseSquareRootDecayLR(o, 2.0, 1.0, 16.0),
                                 lambda s: 2.0 / math.sqrt(max(s, 16))),
    "PiecewiseConstantLR": (lambda o: lrs.PiecewiseConstantLR(o, [0.3, 0.2, 0.1], [10, 100]),
                            lambda s: 0.3 if s < 10 else (0.2 if s < 100 else 0.1)),
    "SequentialLR": (
        lambda o: lrs.SequentialLR(o, [lrs.LinearLR(o, 0.0, 0.5, 20),
                                       lrs.CosineDecayLR(o, 0.5, 0.0, 280)], [20]),
        lambda s: 0.5 * s / 20 if s < 20 else 0.25 * (1 + math.cos(math.pi * (s - 20) / 280))),
    "ChainedLR": (
        lambda o: lrs.ChainedLR(o, [lrs.ConstantLR(o, 0.4), lrs.StepLR(o, 1.0, 100, 0.5)]),
        lambda s: 0.4 * 0.5 ** (s // 100)),
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_scheduler_follows_its_closed_form(name):
    factory, formula = CLOSED_FORMS[name]
    for s, lr in enumerate(_lrs(factory)):
        assert lr == pytest.approx(formula(s), rel=5e-6, abs=1e-7), (s, lr)  # float32, above


def test_configure_lr_scheduler_in_its_three_forms_and_errors():
    def opt():
        return cstorch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)

    s = cstorch.optim.configure_lr_scheduler(opt(), 0.02)
    assert isinstance(s, lrs.ConstantLR) and float(s.get_last_lr()[0]) == pytest.approx(0.02)
    for name in ("Linear", "LinearLR", "linearlr", "linear"):
        s = cstorch.optim.configure_lr_scheduler(opt(), {
            "scheduler": name, "initial_learning_rate": 0.1, "end_learning_rate": 0.2,
            "total_iters": 10})
        assert isinstance(s, lrs.LinearLR)
    s = cstorch.optim.configure_lr_scheduler(opt(), {"scheduler": "cosinedecay",
                                                     "initial_learning_rate": 1.0,
                                                     "end_learning_rate": 0.0, "total_iters": 4})
    assert isinstance(s, lrs.CosineDecayLR)
    seq = cstorch.optim.configure_lr_scheduler(opt(), [
        {"scheduler": "Constant", "learning_rate": 0.1, "total_iters": 3},
        {"scheduler": "Constant", "learning_rate": 0.2}])
    assert isinstance(seq, lrs.SequentialLR)
    rates = []
    for _ in range(5):
        rates.append(float(seq.get_last_lr()[0]))
        seq.step()
    assert rates == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.2])
    chained = cstorch.optim.configure_lr_scheduler(opt(), [
        {"scheduler": "Constant", "learning_rate": 0.1, "main_scheduler": "ChainedLR"},
        {"scheduler": "Step", "initial_learning_rate": 1.0, "step_size": 2, "gamma": 0.5}])
    assert isinstance(chained, lrs.ChainedLR)
    with pytest.raises(ValueError, match=r"learning_rate\[0\] \(Constant\) needs 'total_iters'"):
        cstorch.optim.configure_lr_scheduler(opt(), [
            {"scheduler": "Constant", "learning_rate": 0.1}, {"scheduler": "Constant",
                                                              "learning_rate": 0.2}])
    with pytest.raises(ValueError, match="unknown scheduler 'Linaer'"):
        cstorch.optim.configure_lr_scheduler(opt(), {"scheduler": "Linaer"})
    with pytest.raises(ValueError, match="needs a 'scheduler' key"):
        cstorch.optim.configure_lr_scheduler(opt(), {"initial_learning_rate": 0.1})
    with pytest.raises(TypeError, match="LinearLR has no argument 'end_lr'"):
        cstorch.optim.configure_lr_scheduler(opt(), {"scheduler": "Linear", "end_lr": 0.1})
    with pytest.raises(TypeError, match="expected a number, a dict or a list"):
        cstorch.optim.configure_lr_scheduler(opt(), "0.1")


# -- loss scaling --------------------------------------------------------------------------------
def test_dynamic_loss_scaling_skips_an_inf_step_and_lowers_then_raises_the_scale():
    w = torch.nn.Parameter(torch.ones(3))
    opt = cstorch.optim.Adam([w], lr=0.1)
    scaler = cstorch.amp.GradScaler("dynamic", init_scale=8.0, steps_per_increase=2,
                                    min_loss_scale=1.0, max_loss_scale=16.0,
                                    overflow_tolerance=0.0)

    def step(bad):
        loss = (w * torch.tensor([1.0, float("inf") if bad else 2.0, 3.0])).sum()
        cstorch.amp.optimizer_step(loss, opt, scaler)

    before = w.detach().clone()
    step(bad=True)
    assert torch.equal(w.detach(), before)                     # the update was skipped
    assert float(opt.state[w]["beta1_power"]) == pytest.approx(0.9)  # and so was the state
    assert float(scaler.get_scale()) == 4.0 and int(scaler.get_num_skipped_steps()) == 1
    step(bad=False)
    assert not torch.equal(w.detach(), before)
    step(bad=False)
    assert float(scaler.get_scale()) == 4.0                    # 2 clean steps: not yet
    step(bad=False)
    assert float(scaler.get_scale()) == 8.0                    # more than steps_per_increase
    for _ in range(8):
        step(bad=False)
    assert float(scaler.get_scale()) == 16.0                   # bounded by max_loss_scale
    for _ in range(8):
        step(bad=True)
    assert float(scaler.get_scale()) == 1.0                    # bounded by min_loss_scale
    assert float(scaler.get_non_clamped_scale()) == 0.5
    assert int(scaler.get_num_skipped_steps()) == 9


def test_overflow_tolerance_lowers_the_scale_only_past_the_share_of_overflowing_steps():
    w = torch.nn.Parameter(torch.ones(2))
    opt = cstorch.optim.SGD([w], lr=0.1)
    scaler = cstorch.amp.GradScaler("dynamic", init_scale=64.0, steps_per_increase=100,
                                    overflow_tolerance=0.3)
    scales = []
    for bad in (0, 0, 0, 1, 0, 1):
        loss = (w * torch.tensor([1.0, float("nan") if bad else 1.0])).sum()
        cstorch.amp.optimizer_step(loss, opt, scaler)
        scales.append(float(scaler.get_scale()))
    # overflows/steps: 1/4 is within 0.3, 2/6 is past it
    assert scales == [64.0, 64.0, 64.0, 64.0, 64.0, 32.0]
    assert scaler.state_dict()["steps_since_rescale"] == 0


def test_grad_scaler_calls_in_the_wrong_order_are_refused():
    w = torch.nn.Parameter(torch.ones(2))
    opt = cstorch.optim.SGD([w], lr=0.1)
    scaler = cstorch.amp.GradScaler("dynamic")
    with pytest.raises(RuntimeError, match="update\\(\\) before step\\(\\)"):
        scaler.update()
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    scaler.unscale_(opt)  # a second unscale_ does nothing
    assert torch.equal(w.grad, torch.ones(2))
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step"):
        scaler.unscale_(opt)
    with pytest.raises(ValueError, match="does not take a new_scale"):
        scaler.update(new_scale=4.0)
    scaler.update()


def test_update_if_finite_keeps_an_extra_tensor_of_a_skipped_step_and_isfinite_tells():
    class Counting(cstorch.optim.SGD):
        """SGD that also counts its steps in a tensor outside ``state``."""

        def __init__(self, params, lr):
            super().__init__(params, lr=lr)
            self.count = torch.zeros(())
            self.seen = []

        @torch.no_grad()
        def step(self, closure=None):
            cstorch.amp.update_if_finite(self, self.count)
            self.seen.append(bool(cstorch.amp.isfinite(self)))
            self.count.add_(1)
            return super().step(closure)

    w = torch.nn.Parameter(torch.ones(2))
    opt = Counting([w], lr=0.1)
    scaler = cstorch.amp.GradScaler("dynamic", init_scale=4.0)
    for bad in (False, True, False):
        loss = (w * torch.tensor([1.0, float("inf") if bad else 1.0])).sum()
        cstorch.amp.optimizer_step(loss, opt, scaler)
    assert opt.seen == [True, False, True]
    assert float(opt.count) == 2.0          # the skipped step's count was undone
    assert cstorch.amp.isfinite(opt) is True  # outside a step
    opt.step()                               # no scaler: update_if_finite does nothing
    assert float(opt.count) == 3.0


def test_half_dtype_helpers_follow_the_reference_api():
    try:
        assert cstorch.amp.set_half_dtype("cbfloat16") == torch.float16
        assert cstorch.amp.get_half_dtype_str() == "cbfloat16"
        assert cstorch.amp.mixed_precision()
        assert cstorch.amp.get_floating_point_dtype() == torch.float16
        assert cstorch.amp.set_half_dtype(torch.bfloat16) == torch.bfloat16
        cstorch.amp.enable_mixed_precision(False)
        assert cstorch.amp.get_floating_point_dtype() == torch.float32
        assert cstorch.amp.get_floating_point_dtype_str() == "float32"
        with pytest.raises(ValueError, match="Invalid half dtype: 'float8'"):
            cstorch.amp.set_half_dtype("float8")
    finally:
        cstorch.amp.set_half_dtype(torch.float16)
        cstorch.amp.enable_mixed_precision(False)


def test_float16_training_with_loss_scaling_avoids_the_underflow_of_the_unscaled_run():
    def train(scaler):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        opt = cstorch.optim.SGD(model.parameters(), lr=1e6)  # makes ~1e-9 gradients visible
        x, y = torch.randn(8, 4), torch.zeros(8, 1)
        for _ in range(3):
            with cstorch.amp.autocast():  # float16 activations and their gradients
                out = model(x)
            loss = ((out.float() - y) ** 2).mean() * 1e-9  # gradients below float16's range
            cstorch.amp.optimizer_step(loss, opt, scaler)
            assert torch.isfinite(loss)
        return model[0].weight.detach().clone()

    torch.manual_seed(0)
    initial = torch.nn.Linear(4, 4).weight.detach().clone()
    unscaled = train(None)
    scaled = train(cstorch.amp.GradScaler("dynamic", init_scale=2.0 ** 20,
                                          max_loss_scale=2.0 ** 20))
    assert torch.equal(unscaled, initial)            # every gradient underflowed to zero
    assert not torch.equal(scaled, initial)          # scaled gradients survived
    assert torch.isfinite(scaled).all()


@pytest.mark.parametrize("clip", [dict(max_gradient_norm=0.5), dict(max_gradient_norm=1e6),
                                  dict(max_gradient_val=0.01)])
def test_optimizer_step_clips_gradients_exactly_as_torch_does(clip):
    def run(step):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(5, 4), torch.nn.Linear(4, 2).double()
        frozen = torch.nn.Parameter(torch.ones(3))
        params = [*a.parameters(), frozen, *b.parameters()]
        opt = cstorch.optim.SGD(params, lr=0.1, momentum=0.9)
        for x, _ in batches(20):
            step(b(torch.tanh(a(x)).double()).square().sum(), opt, params)
        return [p.detach().clone() for p in params]

    def ours(loss, opt, params):
        cstorch.amp.optimizer_step(loss, opt, None, **clip)

    def torchs(loss, opt, params):
        loss.backward()
        if "max_gradient_norm" in clip:
            torch.nn.utils.clip_grad_norm_(params, clip["max_gradient_norm"], foreach=False)
        else:
            torch.nn.utils.clip_grad_value_(params, clip["max_gradient_val"], foreach=False)
        opt.step()
        opt.zero_grad()

    for x, y in zip(run(ours), run(torchs)):
        assert torch.equal(x, y)


def test_clip_grad_norm_returns_the_total_norm_and_handles_no_gradients():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    assert float(cstorch.amp.grad_scaler.clip_grad_norm_([w], 1.0)) == 0.0
    w.grad = torch.tensor([3.0, 4.0])
    total = cstorch.amp.grad_scaler.clip_grad_norm_([w], 1.0)
    assert float(total) == 5.0
    torch.testing.assert_close(w.grad, torch.tensor([0.6, 0.8]))


def test_clipping_by_norm_and_by_value_together_is_an_error():
    w = torch.nn.Parameter(torch.ones(2))
    opt = cstorch.optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="by norm \\(=1.0\\) or by value \\(=1.0\\), not both"):
        cstorch.amp.optimizer_step(w.sum(), opt, None, max_gradient_norm=1.0,
                                   max_gradient_val=1.0)


def test_use_bfloat16_switches_autocast_to_bfloat16():
    try:
        cstorch.amp.use_bfloat16(True)
        with cstorch.amp.autocast():
            out = torch.nn.Linear(3, 3)(torch.randn(2, 3))
        assert out.dtype == torch.bfloat16
    finally:
        cstorch.amp.use_bfloat16(False)
    with cstorch.amp.autocast():
        assert torch.nn.Linear(3, 3)(torch.randn(2, 3)).dtype == torch.float16


# -- the porting guide's skeletons, and tracing --------------------------------------------------
class CustomOptimizer(cstorch.optim.Optimizer):
    """The skeleton of Cerebras' porting guide, filled in: SGD with a decaying trust factor."""

    def __init__(self, params, lr=0.1, decay=0.9):
        super().__init__(params, dict(lr=lr, decay=decay), enable_global_step=True)

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["trust"] = cstorch.ones((), dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"].add_(1)
                st["trust"].mul_(group["decay"])
                p.sub_(p.grad * group["lr"] * (0.5 + st["trust"]))

    def state_names_to_sparsify(self):
        return []


class CustomScheduler(cstorch.optim.lr_scheduler.LRScheduler):
    """The porting guide's skeleton, filled in: linear warm-up then 1/sqrt decay, in closed form."""

    def __init__(self, optimizer, peak=0.1, warmup=5):
        self.peak, self.warmup = peak, warmup
        super().__init__(optimizer, total_iters=None, last_epoch=-1)

    def _get_closed_form_lr(self):
        step = self.last_epoch
        return torch.where(step < self.warmup, self.peak * (step + 1) / self.warmup,
                           self.peak * (self.warmup / (step + 1)) ** 0.5)


def _train_loop(kind, make_opt, make_sched=None, make_scaler=None, steps=12, hidden=8,
                **options):
    """The porting guide's full step (``optimizer_step`` with clipping, optionally a loss scaler
    and a scheduler) on a 5-``hidden``-2 MLP; returns losses, final weights and the executor."""
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    model = torch.nn.Sequential(torch.nn.Linear(5, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, 2))
    compiled = cstorch.compile(model, backend)
    opt = make_opt(model.parameters())
    sched = make_sched(opt) if make_sched else None
    scaler = make_scaler() if make_scaler else None
    losses = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt, scaler, max_gradient_norm=1.0)
        if sched is not None:
            sched.step()
        return loss

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: batches(6)), num_steps=steps)
    for batch in executor:
        record(step(batch))
    weights = [p.to("cpu").clone() for p in model.parameters()]
    backend.shutdown()
    return losses, weights, executor


def test_the_seeds_custom_optimizer_and_scheduler_work_with_configure_and_train_on_cpu():
    losses = _train_loop("CPU", lambda p: CustomOptimizer(p), lambda o: CustomScheduler(o))[0]
    assert len(losses) == 12 and losses[-1] < losses[0]
    cstorch.optim.OPTIMIZERS["CustomOptimizer"] = CustomOptimizer
    try:
        opt = cstorch.optim.configure_optimizer("customoptimizer", [torch.nn.Parameter(
            torch.ones(1))], lr=0.2)
        assert isinstance(opt, CustomOptimizer)
    finally:
        del cstorch.optim.OPTIMIZERS["CustomOptimizer"]


TRACED = {
    "SGD": lambda p: cstorch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "Adam": lambda p: cstorch.optim.Adam(p, lr=0.01, amsgrad=True),
    "AdamW": lambda p: cstorch.optim.AdamW(p, lr=0.01),
    "Adagrad": lambda p: cstorch.optim.Adagrad(p, lr=0.05, lr_decay=0.01),
    "RMSprop": lambda p: cstorch.optim.RMSprop(p, lr=0.01, centered=True, momentum=0.5),
    "Lion": lambda p: cstorch.optim.Lion(p, lr=0.01, weight_decay=0.1),
    "Adadelta": lambda p: cstorch.optim.Adadelta(p, lr=1.0),
    "Adamax": lambda p: cstorch.optim.Adamax(p, lr=0.01),
    "ASGD": lambda p: cstorch.optim.ASGD(p, lr=0.01, t0=3),
    "NAdam": lambda p: cstorch.optim.NAdam(p, lr=0.01),
    "RAdam": lambda p: cstorch.optim.RAdam(p, lr=0.01),
    "Rprop": lambda p: cstorch.optim.Rprop(p, lr=0.01),
    "Lamb": lambda p: cstorch.optim.Lamb(p, lr=0.01, weight_decay=0.01),
    "Adafactor": lambda p: cstorch.optim.Adafactor(p, lr=0.01, beta1=0.9),
    "Custom": lambda p: CustomOptimizer(p),
}


@pytest.mark.parametrize("name", sorted(TRACED))
def test_every_optimizer_traces_into_a_static_graph_with_eager_numbers(name):
    make = TRACED[name]
    sched = (lambda o: CustomScheduler(o)) if name == "Custom" else (
        lambda o: lrs.SequentialLR(o, [lrs.LinearLR(o, 0.001, 0.01, 4),
                                       lrs.CosineDecayLR(o, 0.01, 0.001, 8)], [4]))
    eager = _train_loop("CPU", make, sched)
    traced = _train_loop("CSX", make, sched, in_process=True)
    for a, b in zip(eager[0], traced[0]):
        assert a == pytest.approx(b, abs=1e-6)
    for a, b in zip(eager[1], traced[1]):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("name", sorted(set(CLOSED_FORMS) | set(TORCH_SCHEDULES)))
def test_every_scheduler_traces_with_eager_numbers(name):
    factory = (CLOSED_FORMS.get(name) or TORCH_SCHEDULES[name])[0]
    eager = _train_loop("CPU", lambda p: cstorch.optim.SGD(p, lr=1.0), factory, steps=6)
    traced = _train_loop("CSX", lambda p: cstorch.optim.SGD(p, lr=1.0), factory, steps=6,
                         in_process=True)
    for a, b in zip(eager[0], traced[0]):
        assert a == pytest.approx(b, abs=1e-6)


def test_the_dynamic_scaler_traces_with_eager_numbers():
    cpu = _train_loop_with_scaler("CPU")
    csx = _train_loop_with_scaler("CSX", in_process=True)
    assert cpu[0] == pytest.approx(csx[0], abs=1e-6)
    for a, b in zip(cpu[1], csx[1]):
        assert torch.allclose(a, b, atol=1e-6)
    assert cpu[2] == csx[2] == 16.0  # 10 clean steps from 4: doubled after steps 4 and 8


def _train_loop_with_scaler(kind, **options):
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    model = torch.nn.Linear(5, 2)
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.Adam(model.parameters(), lr=0.01)
    scaler = cstorch.amp.GradScaler("dynamic", init_scale=4.0, steps_per_increase=3)
    losses = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt, scaler)
        return loss

    @cstorch.step_closure
    def record(loss):
        losses.append(loss.item())

    for batch in cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(lambda: batches(10)), num_steps=10):
        record(step(batch))
    weights = [p.to("cpu").clone() for p in model.parameters()]
    scale = float(scaler.get_scale())
    backend.shutdown()
    return losses, weights, scale


def test_inductor_compiles_the_full_step_with_adamw_and_gives_fx_losses(tmp_path):
    """The porting guide's full step with AdamW, a dynamic loss scaler and clipping, compiled by
    inductor and replayed by fx."""
    def run(compiler):
        return _train_loop("CSX", lambda p: cstorch.optim.AdamW(p, lr=1e-2), steps=6,
                           make_scaler=lambda: cstorch.amp.GradScaler("dynamic",
                                                                      init_scale=2.0 ** 10),
                           hidden=256, in_process=True,
                           compiler=compiler, compile_dir=tmp_path / "cc")

    fx = run("fx")[0]
    ind, _, ex = run("inductor")
    assert ex.summary["compile"]["active"] == "inductor"
    assert len(ind) == 6
    assert ind == pytest.approx(fx, rel=1e-4)


def test_release_2_0_scheduler_arguments_that_do_nothing_are_dropped_with_a_warning():
    """GPT-2 small's Release 2.0 configuration gives Linear an ``alpha``: it warns and runs;
    an argument no configuration carries is still an error."""
    opt = cstorch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.warns(UserWarning, match=r"learning_rate\[1\]: scheduler LinearLR takes no "
                                         r"'alpha'; ignored"):
        sched = cstorch.optim.configure_lr_scheduler(opt, [
            {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.6,
             "total_iters": 2},
            {"scheduler": "Linear", "initial_learning_rate": 0.6, "end_learning_rate": 0.0,
             "alpha": 0.1, "total_iters": 4}])
    rates = []
    for _ in range(6):
        rates.append(round(float(sched.get_last_lr()[0]), 6))
        opt.step()
        sched.step()
    assert rates == [0.0, 0.3, 0.6, 0.45, 0.3, 0.15]
    with pytest.raises(TypeError, match="LinearLR has no argument 'beta'"):
        cstorch.optim.configure_lr_scheduler(opt, {"scheduler": "Linear", "beta": 0.1})
