"""Building optimizer parameter groups and checking optimizer and scheduler settings from a run
configuration's ``optimizer`` section (Release 2.0-2.2 Cerebras flows).

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
>>> groups = configure_param_groups(m, {"weight_decay": 0.1, "adjust_learning_rate": {"0": 0.5}})
>>> [(g["weight_decay"], g["adjust_learning_rate"], g["param_names"]) for g in groups]
[(0.1, 0.5, ['0.weight']), (0.0, 0.5, ['0.bias']), (0.0, 1.0, ['1.weight', '1.bias'])]
"""

from __future__ import annotations

import inspect
import logging

import torch

from cstream.optim.registry import IGNORED_SCHEDULER_ARGUMENTS, OPTIMIZERS, scheduler_class
from workers.torch_compat import NormBase

logger = logging.getLogger("cstream.optim")

_NORMS = (NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


def _no_decay_names(model: torch.nn.Module) -> set[str]:
    """Biases and the parameters of normalisation layers: not weight-decayed."""
    names = set()
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if isinstance(module, _NORMS) or p_name == "bias":
                names.add(full)
    return names


def configure_param_groups(model: torch.nn.Module, optimizer_params: dict) -> list[dict]:
    """The model's trainable parameters in groups: biases and normalisation parameters get
    ``weight_decay`` 0.0, the others ``optimizer_params["weight_decay"]`` (0.0 when unset);
    a parameter whose name contains a key of ``optimizer_params["adjust_learning_rate"]`` gets
    that factor as its group's ``adjust_learning_rate`` (1.0 otherwise: the learning-rate
    scheduler scales each group's rate by it). Groups keep the model's parameter order and
    carry ``param_names``."""
    weight_decay = float(optimizer_params.get("weight_decay", 0.0) or 0.0)
    adjust = dict(optimizer_params.get("adjust_learning_rate") or {})
    no_decay = _no_decay_names(model)
    groups: dict[tuple, dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        wd = 0.0 if name in no_decay else weight_decay
        factor = next((float(f) for key, f in adjust.items() if key in name), 1.0)
        group = groups.setdefault((wd, factor), {"params": [], "param_names": [],
                                                 "weight_decay": wd,
                                                 "adjust_learning_rate": factor})
        group["params"].append(param)
        group["param_names"].append(name)
    return list(groups.values())


DEPRECATED_OPTIMIZER_ALIASES = {
    "weight_decay": ("weight_decay_rate",),
    "betas": (("beta1", "beta2"),),
    "eps": (("eps1", "eps2"),),
    "etas": (("eta1", "eta2"),),
    "step_sizes": (("step_size_min", "step_size_max"),),
}
"""Older spellings of optimizer arguments (a name, or names that together make the argument):
configuration sections that use one are refused with the name to write instead."""


def _signature_shown(cls, signature: inspect.Signature, given: dict) -> str:
    """``cls(...)`` with each argument's value as given, its default otherwise."""
    params = []
    for name, param in list(signature.parameters.items())[1:]:
        shown = given.get(name, param.default if param.default is not inspect.Parameter.empty
                          or name in ("params", "optimizer") else "<missing>")
        params.append(param.replace(default=shown))
    return f"{cls.__name__}{signature.replace(parameters=params)}"


def _refuse_deprecated(cls, found: list[tuple[str, str]]) -> None:
    if found:
        raise ValueError(
            f"{cls.__name__} got the following parameters which are no longer supported. "
            "Please update your configs to use the new parameters instead."
            + "".join(f"\n\texpected: {new}, actual: {old}" for new, old in found))


def configure_optimizer_params(optimizer_type: str, kwargs: dict) -> tuple[type, dict]:
    """The optimizer class named ``optimizer_type`` (case-insensitive) and its keyword arguments
    taken from ``kwargs``, a flattened ``optimizer:`` section: each argument of the class's
    signature is taken from ``kwargs`` by name, and ``lr`` from ``learning_rate`` (a number; a
    scheduler configuration, or none, gives the class's default ``lr`` or 0.1, which the
    scheduler replaces). Keys the class does not take are logged as a warning and left out; an
    older spelling of an argument (``beta1``/``beta2`` for ``betas``, ...) is an error naming the
    new one. ``kwargs`` is left as it was.

    >>> cls, kw = configure_optimizer_params("adamw", {"learning_rate": 0.01, "eps": 1e-8})
    >>> cls.__name__, kw
    ('AdamW', {'lr': 0.01, 'eps': 1e-08})
    """
    by_lower = {k.lower(): v for k, v in OPTIMIZERS.items()}
    cls = by_lower.get(str(optimizer_type).lower())
    if cls is None:
        raise ValueError(f"Invalid optimizer type. Expected one of {sorted(by_lower)}. "
                         f"Got: {optimizer_type}")
    rest = dict(kwargs)
    rate = rest.pop("learning_rate", None)
    rate = float(rate) if isinstance(rate, (int, float, str)) and not isinstance(rate, bool) \
        else None
    signature = inspect.signature(cls.__init__)
    chosen, deprecated = {}, []
    for name, param in list(signature.parameters.items())[2:]:  # after self, params
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            chosen.update(rest)
            rest = {}
            break
        if name in rest:
            chosen[name] = rest.pop(name)
        elif name in ("lr", "learning_rate"):
            default = None if param.default is inspect.Parameter.empty else param.default
            chosen[name] = rate if rate is not None else default if default is not None else 0.1
        else:
            for old in DEPRECATED_OPTIMIZER_ALIASES.get(name, ()):
                if all(o in rest for o in ((old,) if isinstance(old, str) else old)):
                    deprecated.append((name, old if isinstance(old, str) else ", ".join(old)))
                    break
    _refuse_deprecated(cls, deprecated)
    if rest:
        logger.warning(
            f"{cls.__name__} got {len(rest)} unexpected and unused parameters: {sorted(rest)}.\n"
            f"Please ensure that you specified the correct parameters:\n"
            f"{_signature_shown(cls, signature, chosen)}\n"
            "Passing in unused parameters is deprecated behaviour and support for it will be "
            "removed in a future release.")
    return cls, chosen


DEPRECATED_SCHEDULER_ALIASES = {
    "total_iters": ("steps", "decay_steps"),
    "initial_learning_rate": ("learning_rate", "base_lr"),
    "base_lr": ("learning_rate", "initial_learning_rate"),
    "learning_rates": ("values",),
    "milestones": ("boundaries",),
}
"""Older spellings of scheduler arguments: refused with the name to write instead."""


def configure_scheduler_params(learning_rate) -> tuple[type, dict] | None:
    """The scheduler class a ``learning_rate`` dict names under ``scheduler`` (case-insensitive,
    the ``LR`` suffix optional) and its keyword arguments, the rest of the dict; an argument the
    class does not take is an error naming the class's signature, an older spelling one naming
    the new. A number (a constant rate) gives None; a list is checked entry by entry (None).
    ``learning_rate`` is left as it was."""
    if isinstance(learning_rate, (int, float, str)) and not isinstance(learning_rate, bool):
        return None
    if isinstance(learning_rate, (list, tuple)):
        for spec in learning_rate:
            configure_scheduler_params(spec)
        return None
    if not isinstance(learning_rate, dict) or "scheduler" not in learning_rate:
        raise ValueError(
            "learning_rate: a scheduler dict needs a 'scheduler' key naming the class, e.g. "
            f"{{'scheduler': 'Linear', 'initial_learning_rate': 0.1, ...}}; got {learning_rate!r}.")
    rest = {k: v for k, v in learning_rate.items() if k not in ("scheduler", "main_scheduler")}
    cls = scheduler_class(learning_rate["scheduler"])
    for ignored in IGNORED_SCHEDULER_ARGUMENTS.get(cls.__name__, ()):
        rest.pop(ignored, None)
    signature = inspect.signature(cls.__init__)
    chosen, deprecated = {}, []
    for name, param in list(signature.parameters.items())[2:]:  # after self, optimizer
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            chosen.update(rest)
            return cls, chosen
        if name in rest:
            chosen[name] = rest.pop(name)
        elif name.lower() in rest:
            deprecated.append((name, name.lower()))
        else:
            old = next((o for o in DEPRECATED_SCHEDULER_ALIASES.get(name, ()) if o in rest), None)
            if old is not None:
                deprecated.append((name, old))
    _refuse_deprecated(cls, deprecated)
    if rest:
        raise ValueError(
            f"{cls.__name__} got {len(rest)} unexpected parameters: {sorted(rest)}.\n"
            "Please ensure that you specified the correct parameters:\n"
            f"{_signature_shown(cls, signature, chosen)}\n")
    return cls, chosen
