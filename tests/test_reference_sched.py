"""Every learning-rate scheduler against the real ``cerebras.pytorch`` 2.10's figures.

``tests/reference/fixtures/sched.json`` holds what the real package gave (written by
``tests/reference/gen_sched.py``, rerun with ``make reference``): per case, ``get_last_lr()``,
``get_last_value()`` and every param group's ``lr`` after construction and after each of 40
steps, the state dict after 20 steps and the rates of a scheduler that loaded it. cstream must
give the same within float32's bound across CPUs (``reference/tolerance.py``), eagerly (CPU
backend) and traced (CSX), except the listed deviations (docs/reference.md, "Learning-rate schedulers").
"""

from __future__ import annotations

import inspect
import json
import math
import pathlib

import pytest
import torch

import cstream as cstorch
from reference.gen_sched import build, decode, encode, make_optimizer, values
from reference.tolerance import rel_bound

# compares with numbers another program made on another CPU (make test reruns these under
# other float kernels: ATEN_CPU_CAPABILITY / MKL_CBWR)
pytestmark = pytest.mark.cross_cpu

HERE = pathlib.Path(__file__).resolve().parent

REF = json.loads((HERE / "reference" / "fixtures" / "sched.json").read_text())
CASES = REF["cases"]
STEPS, SAVE_AT = REF["steps"], REF["save_at"]
# the real package ran on another CPU and torch version; a rate is at most STEPS float32
# updates of the first one (a chained or multiplicative schedule carries its rounding along)
REL = rel_bound(STEPS)

# cases where cstream follows the docstring instead of the real package (docs/reference.md)
DEVIATIONS = {"warm_restarts"}


def close(got, want, where):
    """Lists of per-group values (None where a group is not scheduled) agree within REL
    relative (1e-9 absolute near zero)."""
    assert len(got) == len(want), where
    for g, w in zip(got, want):
        assert (g is None) == (w is None), (where, got, want)
        if w is not None:
            assert g == pytest.approx(w, rel=REL, abs=1e-9), (where, got, want)


def warm_restarts_by_docstring(step: int, initial=0.5, t_0=9, eta_min=0.01) -> float:
    """SGDR with T_mult=1: T_cur counts the steps since the last restart."""
    t_cur = step % t_0
    return eta_min + (initial - eta_min) * (1 + math.cos(math.pi * t_cur / t_0)) / 2


def expected(name: str) -> list[dict]:
    """The reference's snapshots; for a deviation, what cstream gives instead."""
    steps = CASES[name]["steps"]
    if name != "warm_restarts":
        return steps
    return [{key: [warm_restarts_by_docstring(i)] * 2 for key in snap}
            for i, snap in enumerate(steps)]


def snapshot(sched, opt) -> dict:
    snap = {"last_value": values(sched.get_last_value()),
            "group_value": [float(g[sched.param_group_key]) for g in opt.param_groups]}
    if hasattr(sched, "get_last_lr"):
        snap["last_lr"] = values(sched.get_last_lr())
    return snap


# -- the classes -------------------------------------------------------------------------------
@pytest.mark.parametrize("module,name", [(m, n) for m, classes in REF["signatures"].items()
                                         for n in sorted(classes)])
def test_every_class_of_the_real_modules_exists_with_its_signature(module, name):
    cls = getattr(getattr(cstorch.optim, module), name, None)
    assert cls is not None, f"cstream.optim.{module} has no {name}"
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self"]
    real = REF["signatures"][module][name]
    assert [p.name for p in params[:len(real)]] == [n for n, _ in real]
    # cstream adds arguments only after the real ones, with defaults (LambdaLR's lr_lambda)
    assert all(p.default is not inspect.Parameter.empty for p in params[len(real):])
    for p, (pname, default) in zip(params, real):
        if default is not None:
            assert repr(p.default) == default, (name, pname)


def test_the_lr_schedulers_are_torch_lr_schedulers_as_in_the_real_package():
    opt = make_optimizer(cstorch)
    sched = cstorch.optim.lr_scheduler.LinearLR(opt, 0.1, 0.01, 10)
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)
    assert isinstance(sched, cstorch.optim.lr_scheduler.Scheduler)


def test_a_custom_scheduler_without_a_schedule_and_a_torch_optimizer_are_refused():
    opt = make_optimizer(cstorch)

    class NoSchedule(cstorch.optim.lr_scheduler.LRScheduler):
        pass

    with pytest.raises(TypeError, match="NoSchedule defines no schedule: implement "
                                        "_get_closed_form"):
        NoSchedule(opt)
    torch_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(TypeError, match="LinearLR needs a cstream.optim.Optimizer, got SGD"):
        cstorch.optim.lr_scheduler.LinearLR(torch_opt, 0.1, 0.01, 10)


def test_chained_lr_takes_the_seed_era_optimizer_first_form_too():
    opt = make_optimizer(cstorch)
    spec = CASES["chained"]["spec"]["args"]["schedulers"]
    chained = cstorch.optim.lr_scheduler.ChainedLR(opt, [build(cstorch, opt, s) for s in spec])
    for _ in range(7):
        chained.step()
    close(values(chained.get_last_lr()), CASES["chained"]["steps"][7]["last_lr"], 7)


# -- eagerly -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_scheduler_equals_the_reference_at_every_step_on_cpu(name):
    cstorch.backend("CPU")
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, CASES[name]["spec"])
    got = [snapshot(sched, opt)]
    for _ in range(STEPS):
        opt.step()
        sched.step()
        got.append(snapshot(sched, opt))
    for step, (g, w) in enumerate(zip(got, expected(name))):
        assert sorted(g) == sorted(w)
        for key in w:
            close(g[key], w[key], (name, step, key))


def test_the_real_warm_restarts_stops_annealing_after_its_first_period_and_cstream_restarts():
    """The deviation, shown: after its first period the real package's rate no longer
    anneals, it holds the initial rate for a period, then eta_min for a period, and so on."""
    real = [s["last_lr"][0] for s in CASES["warm_restarts"]["steps"]]
    assert real[:9] == pytest.approx([warm_restarts_by_docstring(i) for i in range(9)], rel=REL)
    assert real[9:] == pytest.approx((([0.5] * 9 + [0.01] * 9) * 2)[:STEPS + 1 - 9])
    cstorch.backend("CPU")
    opt = make_optimizer(cstorch)
    sched = cstorch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, 0.5, T_0=9,
                                                                   eta_min=0.01)
    ours = []
    for _ in range(20):
        ours.append(float(sched.get_last_lr()[0]))
        sched.step()
    assert ours[9:18] == pytest.approx(ours[:9], rel=1e-6)
    with pytest.raises(ValueError, match="T_mult must be an integer >= 1"):
        cstorch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, 0.5, T_0=9, T_mult=0)


# -- state dicts -------------------------------------------------------------------------------
def _state_after(name: str, steps: int):
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, CASES[name]["spec"])
    for _ in range(steps):
        opt.step()
        sched.step()
    return sched


def _assert_same_state(got, want, where):
    """Encoded state dicts (see gen_sched.encode) agree: keys, dtypes, values (floats within
    REL relative)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, got, want)
        for key in want:
            _assert_same_state(got[key], want[key], (*where, key))
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same_state(g, w, (*where, i))
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=REL, abs=1e-9), (where, got, want)
    else:
        assert got == want and type(got) is type(want), (where, got, want)


@pytest.mark.parametrize("name", sorted(set(CASES) - DEVIATIONS))
def test_state_dict_has_the_real_keys_and_values(name):
    cstorch.backend("CPU")
    ours = encode(_state_after(name, SAVE_AT).state_dict())
    _assert_same_state(ours, CASES[name]["state_dict"], (name,))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_real_state_dict_loads_and_the_schedule_continues_as_in_the_real_package(name):
    cstorch.backend("CPU")
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, CASES[name]["spec"])
    sched.load_state_dict(decode(CASES[name]["state_dict"]))
    got = [values(sched.get_last_value())]
    for _ in range(SAVE_AT + 1, STEPS + 1):
        opt.step()
        sched.step()
        got.append(values(sched.get_last_value()))
    want = ([s["last_value"] for s in expected(name)[SAVE_AT:]] if name in DEVIATIONS
            else [r["last_value"] for r in CASES[name]["resumed"]])
    for step, (g, w) in enumerate(zip(got, want), SAVE_AT):
        close(g, w, (name, step))


def test_load_state_dict_refuses_other_param_group_tags():
    cstorch.backend("CPU")
    opt = make_optimizer(cstorch)
    sched = cstorch.optim.lr_scheduler.StepLR(opt, 0.5, 7, 0.7)
    state = decode(CASES["tagged_head"]["state_dict"])
    with pytest.raises(ValueError, match=r"param_group_tags \{'head'\} differ from this "
                                         r"scheduler's None; build the scheduler with "
                                         r"param_group_tags=\['head'\]"):
        sched.load_state_dict(state)


# -- param groups ------------------------------------------------------------------------------
@pytest.mark.parametrize("lr", [0.5, torch.tensor(0.5)], ids=["float", "tensor"])
def test_a_group_lr_held_as_a_float_or_a_tensor_is_scheduled_alike(lr):
    cstorch.backend("CPU")
    opt = make_optimizer(cstorch)
    for group in opt.param_groups:
        group["lr"] = lr
    sched = build(cstorch, opt, CASES["tagged_head"]["spec"])
    rates = []
    for _ in range(STEPS):
        opt.step()
        sched.step()
        rates.append([float(g["lr"]) for g in opt.param_groups])
    for step, snap in enumerate(CASES["tagged_head"]["steps"][1:], 1):
        close(rates[step - 1], snap["group_value"], step)
    assert type(opt.param_groups[0]["lr"]) is type(lr)  # the untagged group is left alone


def test_param_group_tags_that_match_no_group_are_refused_with_the_tags_there_are():
    cstorch.backend("CPU")
    opt = make_optimizer(cstorch)
    with pytest.raises(ValueError, match=r"targets no param group of the optimizer: its groups "
                                         r"are tagged \[None, 'head'\] \(None: untagged\)"):
        cstorch.optim.lr_scheduler.ConstantLR(opt, 0.1, param_group_tags="body")
    with pytest.raises(ValueError, match="names a tag twice"):
        cstorch.optim.lr_scheduler.ConstantLR(opt, 0.1, param_group_tags=["head", "head"])


def test_sgd_takes_each_step_with_the_reference_rate_of_that_step():
    """p <- p - lr_k * grad with grad 1: after 40 steps p = 1 - sum of the first 40 rates."""
    cstorch.backend("CPU")
    p = torch.nn.Parameter(torch.ones(1))
    opt = cstorch.optim.SGD([p], lr=0.5)
    sched = build(cstorch, opt, CASES["sequential"]["spec"])
    for _ in range(STEPS):
        p.grad = torch.ones(1)
        opt.step()
        sched.step()
    rates = [s["last_lr"][0] for s in CASES["sequential"]["steps"][:STEPS]]
    assert float(p.detach()) == pytest.approx(1 - sum(rates), rel=REL)


def test_sgd_decays_each_step_with_the_reference_weight_decay_of_that_step():
    """p <- p - lr * (grad + wd_k * p) with grad 0: p shrinks by (1 - lr * wd_k) per step."""
    cstorch.backend("CPU")
    p = torch.nn.Parameter(torch.ones(1))
    opt = cstorch.optim.SGD([p], lr=0.5, weight_decay=0.01)
    sched = build(cstorch, opt, CASES["wd_cosine_decay"]["spec"])
    want = 1.0
    for snap in CASES["wd_cosine_decay"]["steps"][:STEPS]:
        p.grad = torch.zeros(1)
        opt.step()
        sched.step()
        want *= 1 - 0.5 * snap["last_value"][0]
    assert float(p.detach()) == pytest.approx(want, rel=REL)


# -- traced ------------------------------------------------------------------------------------
def _traced_run(names, load_state=False, steps=STEPS, **options):
    """One traced step that steps every case's optimizer and scheduler; returns the rates
    read inside a step closure after each step, with the rates before the first."""
    backend = cstorch.backend("CSX", **options)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, backend)
    main_opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    pairs = {}
    for name in names:
        opt = make_optimizer(cstorch)
        pairs[name] = (opt, build(cstorch, opt, CASES[name]["spec"]))
        if load_state:
            pairs[name][1].load_state_dict(decode(CASES[name]["state_dict"]))
    got = {name: [values(s.get_last_value())] for name, (_, s) in pairs.items()}

    @cstorch.trace
    def train_step(batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        main_opt.step()
        main_opt.zero_grad()
        for opt, sched in pairs.values():
            opt.step()
            sched.step()
        return loss

    @cstorch.step_closure
    def record():
        for name, (_, sched) in pairs.items():
            got[name].append(values(sched.get_last_value()))

    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(5)]
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: data), num_steps=steps)
    for batch in executor:
        train_step(batch)
        record()
    after = {name: values(s.get_last_value()) for name, (_, s) in pairs.items()}
    backend.shutdown()
    return got, after


def test_every_scheduler_traced_on_csx_equals_the_reference_at_every_step():
    got, after = _traced_run(sorted(CASES), in_process=True)
    for name in CASES:
        want = [s["last_value"] for s in expected(name)]
        assert len(got[name]) == STEPS + 1
        for step, (g, w) in enumerate(zip(got[name], want)):
            close(g, w, (name, step))
        close(after[name], want[-1], (name, "after the run"))


def test_get_last_lr_inside_the_traced_step_passed_to_a_step_closure_gives_each_steps_rate():
    backend = cstorch.backend("CSX", in_process=True)
    compiled = cstorch.compile(torch.nn.Linear(2, 1), backend)
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, CASES["sequential"]["spec"])
    got = []

    @cstorch.step_closure
    def log(lr):
        got.append(float(lr))

    @cstorch.trace
    def train_step(batch):
        loss = compiled(batch).sum()
        opt.step()
        sched.step()
        log(sched.get_last_lr()[0])
        return loss

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: [torch.ones(1, 2)] * 4), num_steps=12)
    for batch in executor:
        train_step(batch)
    for step, (g, snap) in enumerate(zip(got, CASES["sequential"]["steps"][1:13]), 1):
        close([g], snap["last_lr"][:1], step)
    assert len(got) == 12


def test_real_state_dicts_load_on_csx_and_the_traced_run_continues_as_in_the_real_package():
    names = sorted(set(CASES) - DEVIATIONS)
    got, _ = _traced_run(names, load_state=True, steps=STEPS - SAVE_AT, in_process=True)
    for name in names:
        for step, (g, w) in enumerate(zip(got[name], CASES[name]["resumed"]), SAVE_AT):
            close(g, w["last_value"], (name, step))


def test_schedulers_traced_on_ray_equal_the_reference(ray_session):
    names = ["scale_per_param_sequential", "tagged_sequential", "cyclic_triangular2"]
    got, _ = _traced_run(names, steps=12)
    for name in names:
        for step, (g, w) in enumerate(zip(got[name], CASES[name]["steps"])):
            close(g, w["last_value"], (name, step))


def test_a_scheduler_checkpointed_on_csx_holds_the_real_state_and_resumes_on_cpu(tmp_path):
    """A checkpoint closure on CSX saves the state dict at step 20 with cstream.save; it
    equals the real package's, and loaded into a scheduler on the CPU backend the schedule
    goes on as the real one did."""
    names = ["sequential", "scale_per_param", "chained", "one_cycle"]
    backend = cstorch.backend("CSX", in_process=True)
    torch.manual_seed(0)
    compiled = cstorch.compile(torch.nn.Linear(2, 1), backend)
    pairs = {}
    for name in names:
        opt = make_optimizer(cstorch)
        pairs[name] = (opt, build(cstorch, opt, CASES[name]["spec"]))

    @cstorch.trace
    def train_step(batch):
        loss = compiled(batch).sum()
        for opt, sched in pairs.values():
            opt.step()
            sched.step()
        return loss

    @cstorch.checkpoint_closure
    def save(step):
        cstorch.save({name: s.state_dict() for name, (_, s) in pairs.items()},
                     tmp_path / f"ckpt_{step}.h5")

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: [torch.ones(1, 2)] * 4), num_steps=SAVE_AT,
        checkpoint_steps=SAVE_AT)
    for step, batch in enumerate(executor, 1):
        train_step(batch)
        save(step)
    backend.shutdown()

    from executor import runtime

    runtime.reset()
    cstorch.backend("CPU")
    saved = cstorch.load(tmp_path / f"ckpt_{SAVE_AT}.h5", map_location="cpu")
    for name in names:
        state = {k: v for k, v in saved[name].items()}
        _assert_same_state(encode(_plain(state)), CASES[name]["state_dict"], (name,))
        opt = make_optimizer(cstorch)
        sched = build(cstorch, opt, CASES[name]["spec"])
        sched.load_state_dict(state)
        for step, want in enumerate(CASES[name]["resumed"], SAVE_AT):
            close(values(sched.get_last_lr()), want["last_value"], (name, step))
            opt.step()
            sched.step()


def _plain(obj):
    """What cstream.load returned, as plain dicts and lists (it hands out lazy mappings)."""
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# -- configure_lr_scheduler --------------------------------------------------------------------
def test_configure_lr_scheduler_takes_the_model_zoos_adjust_learning_rate():
    """``configure_lr_scheduler(optimizer, learning_rate, adjust_learning_rate)``, as the Model
    Zoo calls it: the groups' ``adjust_learning_rate`` scales their rates."""
    cstorch.backend("CPU")
    learning_rate = [  # the shape of a Model Zoo 2.0 GPT-2 config
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.2,
         "total_iters": 5},
        {"scheduler": "Linear", "initial_learning_rate": 0.2, "end_learning_rate": 0.02,
         "total_iters": 30}]
    opt = make_optimizer(cstorch)
    sched = cstorch.optim.configure_lr_scheduler(opt, learning_rate,
                                                 {"decoder_kernel": 0.5})
    assert isinstance(sched, cstorch.optim.lr_scheduler.ScalePerParamLR)
    plain = cstorch.optim.configure_lr_scheduler(make_optimizer(cstorch), learning_rate, None)
    assert isinstance(plain, cstorch.optim.lr_scheduler.SequentialLR)
    want = CASES["scale_per_param_sequential"]["steps"]
    for step in range(STEPS + 1):
        close(values(sched.get_last_lr()), want[step]["last_lr"], step)
        assert float(plain.get_last_lr()[1]) == pytest.approx(want[step]["last_lr"][0],
                                                              rel=REL, abs=1e-9)
        sched.step()
        plain.step()
