"""The optimizers and schedulers a configuration names, by class name, and the check of their
arguments."""

from __future__ import annotations

import inspect

from cstream.optim import lr_scheduler
from cstream.optim.muon import Muon
from cstream.optim.optimizers import (
    ASGD, SGD, Adadelta, Adafactor, Adagrad, Adam, Adamax, AdamW, Lamb, Lion, NAdam, RAdam,
    RMSprop, Rprop,
)
from workers.checks import did_you_mean

OPTIMIZERS = {cls.__name__: cls for cls in (
    SGD, Adam, AdamW, Adagrad, Adadelta, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop, Lamb, Lion,
    Adafactor, Muon)}


IGNORED_SCHEDULER_ARGUMENTS = {"LinearLR": ("alpha",),
                               "PiecewiseConstantLR": ("initial_learning_rate",)}
"""Arguments the Model Zoo's Release 2.0 configurations give schedulers that do not take them
(GPT-2 small's ``Linear`` carries ``alpha``; two ``PiecewiseConstant`` schedules carry
``initial_learning_rate``): dropped with a warning. Any other unknown argument is an error."""


def optimizer_class(optimizer_type: str):
    """The class of :data:`OPTIMIZERS` that ``optimizer_type`` names (case-insensitive); an error
    listing them otherwise."""
    cls = {k.lower(): v for k, v in OPTIMIZERS.items()}.get(str(optimizer_type).lower())
    if cls is None:
        raise ValueError(f"unknown optimizer_type {optimizer_type!r}; choose one of "
                         f"{', '.join(sorted(OPTIMIZERS))} (case-insensitive).")
    return cls


def _argument_names(cls, skip) -> list[str]:
    """The named arguments of ``cls.__init__`` but ``skip``, in signature order."""
    params = inspect.signature(cls.__init__).parameters
    return [n for n in params if n not in skip and params[n].kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def valid_kwargs(cls, skip=("self", "optimizer", "params")) -> list[str] | None:
    """The keyword arguments ``cls`` takes, in signature order; None when it takes any
    (``**kwargs``)."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return _argument_names(cls, skip)


def unused_kwargs_note(cls, unused: list[str], valid: list[str]) -> str:
    """The warning for keyword arguments ``cls`` does not take (left out, as the Cerebras
    configuration helpers leave them)."""
    hints = "".join(did_you_mean(name, valid) for name in unused)
    return (f"{cls.__name__} got {len(unused)} unexpected and unused parameters: {unused}; "
            f"left out.{hints} Valid arguments: {', '.join(valid)}.")


def check_kwargs(cls, kwargs: dict, what: str, skip=("self", "optimizer", "params")) -> None:
    valid = _argument_names(cls, skip)
    for name in kwargs:
        if name not in valid:
            raise TypeError(
                f"{what} {cls.__name__} has no argument {name!r}.{did_you_mean(name, valid)} "
                "Valid arguments: "
                f"{', '.join(valid)}.")


def scheduler_class(name: str):
    """The scheduler class of :mod:`cstream.optim.lr_scheduler` that ``name`` names
    (case-insensitive, the "LR" suffix optional); an error listing them otherwise."""
    key = str(name).lower()
    for cls_name, cls in lr_scheduler.SCHEDULERS.items():
        low = cls_name.lower()
        if key in (low, low[:-2] if low.endswith("lr") else low):
            return cls
    raise ValueError(
        f"unknown scheduler {name!r}; choose one of {', '.join(sorted(lr_scheduler.SCHEDULERS))} "
        "(case-insensitive, the 'LR' suffix optional).")
