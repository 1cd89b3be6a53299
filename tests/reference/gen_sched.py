"""Reference figures for every scheduler of ``cerebras.pytorch.optim.lr_scheduler`` (and some of
``weight_decay_scheduler``).

Runs under the real package only (``python -m reference.generate gen_sched`` in ``tests/``). Writes
``fixtures/sched.json``: for each case, the scheduler's description (class, arguments, nested
schedulers), and what the real package gave on its CPU backend: ``get_last_lr()``,
``get_last_value()`` and every param group's ``lr`` (``weight_decay``) after construction and
after each of ``STEPS`` steps; the state dict after ``SAVE_AT`` steps (tensors, sets and nested
state dicts spelled out, see :func:`encode`); and the values of a fresh scheduler that loaded
that state dict and took the remaining steps; and every class's constructor signature.

Every optimizer (SGD, lr 0.5, weight_decay 0.01) has two param groups: group 0 untagged,
group 1 tagged ``"head"`` with ``adjust_learning_rate`` 0.5 (read by ScalePerParamLR/WD).
A few cases are weight-decay schedulers (``weight_decay_scheduler``, ``*WD``).
"""

from __future__ import annotations

import json
import pathlib
import warnings

import torch

from reference.realpkg import cpu_backend

STEPS = 40
SAVE_AT = 20


def lin(a, b, n):
    return {"cls": "LinearLR", "args": {"initial_learning_rate": a, "end_learning_rate": b,
                                        "total_iters": n}}


CASES = {
    "constant": {"cls": "ConstantLR", "args": {"learning_rate": 0.3}},
    "constant_total_iters": {"cls": "ConstantLR", "args": {"learning_rate": 0.2,
                                                           "total_iters": 10}},
    "linear": lin(0.1, 0.01, 25),
    "linear_up": lin(0.0, 0.5, 10),
    "linear_cycle": {"cls": "LinearLR", "args": {"initial_learning_rate": 0.1,
                                                 "end_learning_rate": 0.01, "total_iters": 12,
                                                 "cycle": True}},
    "polynomial": {"cls": "PolynomialLR", "args": {"initial_learning_rate": 0.5,
                                                   "end_learning_rate": 0.01,
                                                   "total_iters": 30, "power": 2.0}},
    "polynomial_cycle": {"cls": "PolynomialLR", "args": {"initial_learning_rate": 0.5,
                                                         "end_learning_rate": 0.0,
                                                         "total_iters": 13, "power": 0.5,
                                                         "cycle": True}},
    "exponential": {"cls": "ExponentialLR", "args": {"initial_learning_rate": 0.5,
                                                     "total_iters": 10, "decay_rate": 0.5}},
    "exponential_staircase": {"cls": "ExponentialLR", "args": {
        "initial_learning_rate": 0.5, "total_iters": 7, "decay_rate": 0.3, "staircase": True}},
    "inverse_exponential": {"cls": "InverseExponentialTimeDecayLR", "args": {
        "initial_learning_rate": 0.5, "step_exponent": 1, "total_iters": 10,
        "decay_rate": 0.2}},
    "inverse_exponential_staircase": {"cls": "InverseExponentialTimeDecayLR", "args": {
        "initial_learning_rate": 0.5, "step_exponent": 2, "total_iters": 30, "decay_rate": 0.5,
        "staircase": True}},
    "inverse_sqrt_defaults": {"cls": "InverseSquareRootDecayLR", "args": {}},
    "inverse_sqrt": {"cls": "InverseSquareRootDecayLR", "args": {
        "initial_learning_rate": 2.0, "scale": 0.5, "warmup_steps": 16}},
    "cosine_decay": {"cls": "CosineDecayLR", "args": {"initial_learning_rate": 0.5,
                                                      "end_learning_rate": 0.01,
                                                      "total_iters": 30}},
    "cosine_decay_to_zero": {"cls": "CosineDecayLR", "args": {"initial_learning_rate": 0.1,
                                                              "end_learning_rate": 0.0,
                                                              "total_iters": 13}},
    "step": {"cls": "StepLR", "args": {"initial_learning_rate": 0.5, "step_size": 7,
                                       "gamma": 0.7}},
    "multistep": {"cls": "MultiStepLR", "args": {"initial_learning_rate": 0.5, "gamma": 0.3,
                                                 "milestones": [5, 17, 30]}},
    "piecewise": {"cls": "PiecewiseConstantLR", "args": {"learning_rates": [0.3, 0.2, 0.1],
                                                         "milestones": [10, 25]}},
    "cosine_annealing": {"cls": "CosineAnnealingLR", "args": {
        "initial_learning_rate": 0.5, "T_max": 13, "eta_min": 0.01}},
    "cosine_annealing_long": {"cls": "CosineAnnealingLR", "args": {
        "initial_learning_rate": 0.1, "T_max": 40}},
    "warm_restarts": {"cls": "CosineAnnealingWarmRestarts", "args": {
        "initial_learning_rate": 0.5, "T_0": 9, "eta_min": 0.01}},
    "lambda": {"cls": "LambdaLR", "args": {"initial_learning_rate": 0.5}},
    "multiplicative": {"cls": "MultiplicativeLR", "args": {"initial_learning_rate": 0.5,
                                                           "coefficient": 0.93}},
    "cyclic_triangular": {"cls": "CyclicLR", "args": {"base_lr": 0.01, "max_lr": 0.1,
                                                      "step_size_up": 5,
                                                      "scale_mode": "iterations"}},
    "cyclic_triangular2": {"cls": "CyclicLR", "args": {"base_lr": 0.01, "max_lr": 0.1,
                                                       "step_size_up": 4,
                                                       "step_size_down": 6,
                                                       "mode": "triangular2"}},
    "cyclic_exp_range": {"cls": "CyclicLR", "args": {"base_lr": 0.01, "max_lr": 0.1,
                                                     "step_size_up": 5, "mode": "exp_range",
                                                     "gamma": 0.97}},
    "one_cycle": {"cls": "OneCycleLR", "args": {"initial_learning_rate": 0.004, "max_lr": 0.1,
                                                "total_steps": 40}},
    "one_cycle_three_phase_linear": {"cls": "OneCycleLR", "args": {
        "initial_learning_rate": 0.004, "max_lr": 0.1, "total_steps": 30, "pct_start": 0.25,
        "final_div_factor": 100.0, "three_phase": True, "anneal_strategy": "linear"}},
    "one_cycle_three_phase_cos": {"cls": "OneCycleLR", "args": {
        "initial_learning_rate": 0.01, "max_lr": 0.2, "total_steps": 36, "pct_start": 0.3,
        "three_phase": True}},
    "sequential": {"cls": "SequentialLR", "args": {
        "schedulers": [lin(0.0, 0.5, 10),
                       {"cls": "CosineDecayLR", "args": {"initial_learning_rate": 0.5,
                                                         "end_learning_rate": 0.0,
                                                         "total_iters": 20}},
                       {"cls": "ConstantLR", "args": {"learning_rate": 0.05}}],
        "milestones": [10, 30]}},
    "chained": {"cls": "ChainedLR", "args": {"schedulers": [
        lin(0.1, 0.2, 20),
        {"cls": "StepLR", "args": {"initial_learning_rate": 1.0, "step_size": 5,
                                   "gamma": 0.5}},
        {"cls": "ExponentialLR", "args": {"initial_learning_rate": 2.0, "total_iters": 10,
                                          "decay_rate": 0.8}}]}},
    "chained_scheduler_alias": {"cls": "ChainedScheduler", "args": {"schedulers": [
        {"cls": "ConstantLR", "args": {"learning_rate": 0.4}},
        {"cls": "MultiStepLR", "args": {"initial_learning_rate": 1.0, "gamma": 0.5,
                                        "milestones": [8, 16]}}]}},
    "scale_per_param": {"cls": "ScalePerParamLR", "args": {"scheduler": lin(0.1, 0.01, 30)}},
    "scale_per_param_sequential": {"cls": "ScalePerParamLR", "args": {"scheduler": {
        "cls": "SequentialLR", "args": {"schedulers": [lin(0.0, 0.2, 5), lin(0.2, 0.02, 30)],
                                        "milestones": [5]}}}},
    "tagged_head": {"cls": "CosineDecayLR", "args": {"initial_learning_rate": 0.5,
                                                     "end_learning_rate": 0.01,
                                                     "total_iters": 30,
                                                     "param_group_tags": "head"}},
    "tagged_untagged_groups": {"cls": "StepLR", "args": {"initial_learning_rate": 0.5,
                                                         "step_size": 7, "gamma": 0.7,
                                                         "param_group_tags": [None]}},
    "wd_cosine_decay": {"module": "weight_decay_scheduler", "cls": "CosineDecayWD", "args": {
        "initial_val": 0.1, "end_val": 0.001, "total_iters": 30}},
    "wd_piecewise": {"module": "weight_decay_scheduler", "cls": "PiecewiseConstantWD",
                     "args": {"vals": [0.1, 0.05, 0.0], "milestones": [10, 25]}},
    "wd_sequential_tagged": {"module": "weight_decay_scheduler", "cls": "SequentialWD", "args": {
        "schedulers": [{"cls": "LinearWD", "args": {"initial_val": 0.0, "end_val": 0.1,
                                                    "total_iters": 10,
                                                    "param_group_tags": "head"}},
                       {"cls": "ExponentialWD", "args": {"initial_val": 0.1, "total_iters": 10,
                                                         "decay_rate": 0.5,
                                                         "param_group_tags": "head"}}],
        "milestones": [10], "param_group_tags": "head"}},
    "wd_scale_per_param": {"module": "weight_decay_scheduler", "cls": "ScalePerParamWD",
                           "args": {"scheduler": {"cls": "StepWD", "args": {
                               "initial_val": 0.1, "step_size": 7, "gamma": 0.5}}}},
    "tagged_sequential": {"cls": "SequentialLR", "args": {
        "schedulers": [{"cls": "LinearLR", "args": {
                           "initial_learning_rate": 0.0, "end_learning_rate": 0.3,
                           "total_iters": 8, "param_group_tags": ["head"]}},
                       {"cls": "ExponentialLR", "args": {
                           "initial_learning_rate": 0.3, "total_iters": 10,
                           "decay_rate": 0.5, "param_group_tags": ["head"]}}],
        "milestones": [8], "param_group_tags": ["head"]}},
}


def make_optimizer(cstorch):
    torch.manual_seed(0)
    body, head = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    return cstorch.optim.SGD([{"params": [body]},
                              {"params": [head], "tags": {"head"}, "adjust_learning_rate": 0.5}],
                             lr=0.5, weight_decay=0.01)


def build(cstorch, optimizer, spec, module=None):
    """The scheduler ``spec`` describes; nested specs (``schedulers``, ``scheduler``) first,
    from the same module (``lr_scheduler`` unless the spec names another)."""
    module = spec.get("module", module or "lr_scheduler")

    def value(v):
        if isinstance(v, dict) and "cls" in v:
            return build(cstorch, optimizer, v, module)
        if isinstance(v, list) and v and isinstance(v[0], dict) and "cls" in v[0]:
            return [build(cstorch, optimizer, s, module) for s in v]
        return v

    cls = getattr(getattr(cstorch.optim, module), spec["cls"])
    kwargs = {k: value(v) for k, v in spec["args"].items()}
    if spec["cls"] in ("ChainedLR", "ChainedScheduler", "ChainedWD"):
        return cls(**kwargs)
    return cls(optimizer, **kwargs)


def encode(obj):
    """JSON for a state dict: tensors as ``{"tensor": value, "dtype": ...}``, sets as
    ``{"set": [...]}`` (sorted, None first); everything else as itself."""
    if isinstance(obj, torch.Tensor):
        return {"tensor": obj.tolist(), "dtype": str(obj.dtype).replace("torch.", "")}
    if isinstance(obj, (set, frozenset)):
        return {"set": sorted(obj, key=lambda x: (x is not None, str(x)))}
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    return obj


def decode(obj):
    if isinstance(obj, dict):
        if set(obj) == {"tensor", "dtype"}:
            return torch.tensor(obj["tensor"], dtype=getattr(torch, obj["dtype"]))
        if set(obj) == {"set"}:
            return set(obj["set"])
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def values(vals):
    return [None if v is None else float(v) for v in vals]


def snapshot(sched, opt):
    """The values after a step; ``group_value`` is each group's ``lr`` (``weight_decay`` for a
    weight-decay scheduler)."""
    snap = {"last_value": values(sched.get_last_value()),
            "group_value": [float(g[sched.param_group_key]) for g in opt.param_groups]}
    if hasattr(sched, "get_last_lr"):
        snap["last_lr"] = values(sched.get_last_lr())
    return snap


def run_case(cstorch, spec) -> dict:
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, spec)
    record = {"spec": spec, "steps": [snapshot(sched, opt)]}
    state = None
    for step in range(1, STEPS + 1):
        opt.step()
        sched.step()
        record["steps"].append(snapshot(sched, opt))
        if step == SAVE_AT:
            state = encode(sched.state_dict())
    record["state_dict"] = state
    record["state_dict_keys"] = sorted(state)

    resumed_opt = make_optimizer(cstorch)
    resumed = build(cstorch, resumed_opt, spec)
    resumed.load_state_dict(decode(json.loads(json.dumps(state))))
    record["resumed"] = [{"last_value": values(resumed.get_last_value())}]
    for _ in range(SAVE_AT + 1, STEPS + 1):
        resumed_opt.step()
        resumed.step()
        record["resumed"].append({"last_value": values(resumed.get_last_value())})
    return record


def signatures(module) -> dict:
    """Every public class of ``module`` with its constructor's parameters."""
    import inspect

    out = {}
    for name in dir(module):
        obj = getattr(module, name)
        if inspect.isclass(obj) and obj.__module__.startswith("cerebras.pytorch.optim"):
            params = inspect.signature(obj.__init__).parameters
            out[name] = [[p.name, None if p.default is inspect.Parameter.empty else
                          repr(p.default)] for p in params.values() if p.name != "self"]
    return out


def compact_json(fixture: dict) -> str:
    """One line per case and per signature: small, and a changed case shows as one line."""
    lines = []
    for key, value in sorted(fixture.items()):
        if isinstance(value, dict):
            inner = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                               for k, v in sorted(value.items()))
            lines.append(f" {json.dumps(key)}: {{\n{inner}\n }}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(out: pathlib.Path) -> None:
    import cerebras.pytorch as cstorch

    cpu_backend(cstorch)
    warnings.simplefilter("ignore")
    cases = {name: run_case(cstorch, spec) for name, spec in CASES.items()}
    fixture = {"cerebras_pytorch": cstorch.__version__, "steps": STEPS, "save_at": SAVE_AT,
               "signatures": {m: signatures(getattr(cstorch.optim, m))
                              for m in ("lr_scheduler", "weight_decay_scheduler")},
               "cases": cases}
    (out / "sched.json").write_text(compact_json(fixture))
    print(f"reference: wrote {len(cases)} scheduler cases to {out / 'sched.json'}")
