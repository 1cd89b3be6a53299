"""``cstream.optim``: traceable optimizers, closed-form LR schedulers and their config helpers."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from cstream.optim import lr_scheduler
from cstream.optim.configure import (configure_optimizer_params, configure_param_groups,
                                     configure_scheduler_params)
from cstream.optim.optimizer import Optimizer
from cstream.optim.optimizers import (
    ASGD, SGD, Adadelta, Adafactor, Adagrad, Adam, Adamax, AdamW, Lamb, Lion, NAdam, RAdam,
    RMSprop, Rprop,
)

OPTIMIZERS = {cls.__name__: cls for cls in (
    SGD, Adam, AdamW, Adagrad, Adadelta, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop, Lamb, Lion,
    Adafactor)}

__all__ = ["Optimizer", "configure_lr_scheduler", "configure_optimizer",
           "configure_optimizer_params", "configure_param_groups", "configure_scheduler_params",
           "lr_scheduler",
           *OPTIMIZERS]


def _check_kwargs(cls, kwargs: dict, what: str, skip=("self", "optimizer", "params")) -> None:
    params = inspect.signature(cls.__init__).parameters
    valid = [n for n in params if n not in skip and params[n].kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    for name in kwargs:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{what} {cls.__name__} has no argument {name!r}.{hint} Valid arguments: "
                f"{', '.join(valid)}.")


def configure_optimizer(optimizer_type: str, params, **kwargs: Any) -> Optimizer:
    """Build an optimizer from its name (case-insensitive) and keyword arguments.

    >>> import torch, cstream
    >>> opt = cstream.optim.configure_optimizer("sgd", [torch.nn.Parameter(torch.ones(1))],
    ...                                         lr=0.1, momentum=0.5)
    >>> type(opt).__name__
    'SGD'
    """
    by_lower = {k.lower(): v for k, v in OPTIMIZERS.items()}
    cls = by_lower.get(str(optimizer_type).lower())
    if cls is None:
        raise ValueError(
            f"unknown optimizer_type {optimizer_type!r}; choose one of "
            f"{', '.join(sorted(OPTIMIZERS))} (case-insensitive).")
    _check_kwargs(cls, kwargs, "optimizer")
    return cls(params, **kwargs)


def _scheduler_class(name: str):
    key = str(name).lower()
    for cls_name, cls in lr_scheduler.SCHEDULERS.items():
        low = cls_name.lower()
        if key in (low, low[:-2] if low.endswith("lr") else low):
            return cls
    raise ValueError(
        f"unknown scheduler {name!r}; choose one of {', '.join(sorted(lr_scheduler.SCHEDULERS))} "
        "(case-insensitive, the 'LR' suffix optional).")


def _from_dict(optimizer, spec: dict, where: str):
    if not isinstance(spec, dict) or "scheduler" not in spec:
        raise ValueError(
            f"learning_rate{where}: a scheduler dict needs a 'scheduler' key naming the class, "
            f"e.g. {{'scheduler': 'Linear', 'initial_learning_rate': 0.1, ...}}; got {spec!r}.")
    kwargs = {k: v for k, v in spec.items() if k not in ("scheduler", "main_scheduler")}
    cls = _scheduler_class(spec["scheduler"])
    _check_kwargs(cls, kwargs, f"learning_rate{where}: scheduler")
    return cls(optimizer, **kwargs)


def configure_lr_scheduler(optimizer: Optimizer, learning_rate):
    """Build a scheduler from seed 000's three forms: a number (ConstantLR), a dict (its
    ``scheduler`` key names the class, the rest are arguments), or a list of dicts (SequentialLR,
    each entry with ``total_iters``; ChainedLR if an entry has ``main_scheduler: "ChainedLR"``)."""
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        return lr_scheduler.ConstantLR(optimizer, learning_rate=float(learning_rate))
    if isinstance(learning_rate, dict):
        return _from_dict(optimizer, learning_rate, "")
    if isinstance(learning_rate, (list, tuple)):
        if not learning_rate:
            raise ValueError("learning_rate: an empty list of schedulers.")
        chained = any(isinstance(s, dict) and str(s.get("main_scheduler", "")).lower()
                      == "chainedlr" for s in learning_rate)
        scheds = [_from_dict(optimizer, s, f"[{i}]") for i, s in enumerate(learning_rate)]
        if chained:
            return lr_scheduler.ChainedLR(optimizer, scheds)
        milestones, total = [], 0
        for i, spec in enumerate(learning_rate[:-1]):
            if spec.get("total_iters") is None:
                raise ValueError(
                    f"learning_rate[{i}] ({spec.get('scheduler')}) needs 'total_iters': in a "
                    "SequentialLR each scheduler runs for total_iters steps before the next.")
            total += int(spec["total_iters"])
            milestones.append(total)
        return lr_scheduler.SequentialLR(optimizer, scheds, milestones)
    raise TypeError(
        f"learning_rate: expected a number, a dict or a list of dicts, got "
        f"{type(learning_rate).__name__}.")
