"""``cstream.optim``: traceable optimizers, closed-form LR schedulers and their config helpers."""

from __future__ import annotations

import warnings
from typing import Any

from cstream.optim import lr_scheduler, scheduler, weight_decay_scheduler
from cstream.optim.configure import (configure_optimizer_params, configure_param_groups,
                                     configure_scheduler_params)
from cstream.optim.muon import Muon  # noqa: F401  (in __all__ through OPTIMIZERS)
from cstream.optim.optimizer import Optimizer
from cstream.optim.registry import (
    IGNORED_SCHEDULER_ARGUMENTS, OPTIMIZERS, check_kwargs, optimizer_class, scheduler_class,
    unused_kwargs_note, valid_kwargs,
)
from cstream.optim.scheduler_config import configure_scheduler
from cstream.optim.optimizers import (  # noqa: F401  (in __all__ through OPTIMIZERS)
    ASGD, SGD, Adadelta, Adafactor, Adagrad, Adam, Adamax, AdamW, Lamb, Lion, NAdam, RAdam,
    RMSprop, Rprop,
)


__all__ = ["Optimizer", "configure_lr_scheduler", "configure_optimizer",
           "configure_optimizer_params", "configure_param_groups", "configure_scheduler",
           "configure_scheduler_params", "lr_scheduler", "scheduler", "weight_decay_scheduler",
           *OPTIMIZERS]


SCHEDULED_LR_PLACEHOLDER = 0.1
"""The ``lr`` an optimizer gets from :func:`configure_optimizer` when ``learning_rate`` is a
scheduler configuration: the scheduler sets the rate before the first step."""

NOT_OPTIMIZER_KEYS = frozenset({
    "max_gradient_norm", "max_gradient_value", "max_gradient_val", "loss_scaling_factor",
    "initial_loss_scale", "steps_per_increase", "min_loss_scale", "max_loss_scale",
    "log_summaries", "adjust_learning_rate", "grad_accum_steps"})
"""Keys of a Model Zoo ``optimizer:`` section that other parts of the run read (loss scaling,
clipping, summaries): :func:`configure_optimizer` leaves them out, with a warning."""


def configure_optimizer(optimizer_type: str, params, **kwargs: Any) -> Optimizer:
    """Build an optimizer from its name (case-insensitive) and keyword arguments, as the Model
    Zoo calls it with its ``optimizer:`` section: ``learning_rate`` stands for ``lr`` (a number;
    a scheduler configuration gives :data:`SCHEDULED_LR_PLACEHOLDER`, which the scheduler
    replaces), and :data:`NOT_OPTIMIZER_KEYS` are left out. Other keys the class does not take
    are left out with a warning that names them (and the argument a misspelling is near), as
    the Cerebras helper does: a shipped Model Zoo section may carry keys of another optimizer
    (Release 2.0's StarCoder gives Adam AdamW's ``correct_bias``).

    >>> import torch, cstream
    >>> opt = cstream.optim.configure_optimizer("sgd", [torch.nn.Parameter(torch.ones(1))],
    ...                                         learning_rate=0.1, momentum=0.5)
    >>> type(opt).__name__, opt.param_groups[0]["lr"]
    ('SGD', 0.1)
    """
    cls = optimizer_class(optimizer_type)
    if "learning_rate" in kwargs:
        if "lr" in kwargs:
            raise ValueError("configure_optimizer: give learning_rate or lr (the same "
                             f"argument), not both (got {kwargs['learning_rate']!r} and "
                             f"{kwargs['lr']!r}).")
        rate = kwargs.pop("learning_rate")
        numeric = isinstance(rate, (int, float, str)) and not isinstance(rate, bool)
        kwargs["lr"] = float(rate) if numeric else SCHEDULED_LR_PLACEHOLDER
    unused = sorted(NOT_OPTIMIZER_KEYS & set(kwargs))
    if unused:
        warnings.warn(f"configure_optimizer: {', '.join(unused)} configure other parts of the "
                      f"run, not the {cls.__name__} optimizer; left out.", stacklevel=2)
        kwargs = {k: v for k, v in kwargs.items() if k not in NOT_OPTIMIZER_KEYS}
    valid = valid_kwargs(cls)
    unused = [] if valid is None else sorted(set(kwargs) - set(valid))
    if unused:  # a shipped section may carry another optimizer's keys (Adam's correct_bias)
        warnings.warn(unused_kwargs_note(cls, unused, valid), stacklevel=2)
        kwargs = {k: v for k, v in kwargs.items() if k not in unused}
    return cls(params, **kwargs)


def _from_dict(optimizer, spec: dict, where: str):
    if not isinstance(spec, dict) or "scheduler" not in spec:
        raise ValueError(
            f"learning_rate{where}: a scheduler dict needs a 'scheduler' key naming the class, "
            f"e.g. {{'scheduler': 'Linear', 'initial_learning_rate': 0.1, ...}}; got {spec!r}.")
    kwargs = {k: v for k, v in spec.items() if k not in ("scheduler", "main_scheduler")}
    cls = scheduler_class(spec["scheduler"])
    dropped = [k for k in IGNORED_SCHEDULER_ARGUMENTS.get(cls.__name__, ()) if k in kwargs]
    if dropped:
        warnings.warn(f"learning_rate{where}: scheduler {cls.__name__} takes no "
                      f"{', '.join(map(repr, dropped))}; ignored (remove it from the "
                      "configuration to silence this warning).", stacklevel=3)
        kwargs = {k: v for k, v in kwargs.items() if k not in dropped}
    check_kwargs(cls, kwargs, f"learning_rate{where}: scheduler")
    return cls(optimizer, **kwargs)


def configure_lr_scheduler(optimizer: Optimizer, learning_rate, adjust_learning_rate=None):
    """Build a scheduler from the three forms of Cerebras' porting guide: a number
    (ConstantLR), a dict (its ``scheduler`` key names the class, the rest are arguments), or a
    list of dicts (SequentialLR, each entry with ``total_iters``; ChainedLR if an entry has
    ``main_scheduler: "ChainedLR"``).

    ``adjust_learning_rate`` is the Model Zoo's third argument (its optimizer section's
    per-layer scales, already written into the param groups as ``adjust_learning_rate``):
    when given, the scheduler is wrapped in :class:`~cstream.optim.lr_scheduler.ScalePerParamLR`,
    which multiplies each group's rate by its scale.

    >>> import torch, cstream
    >>> opt = cstream.optim.SGD([{"params": [torch.nn.Parameter(torch.ones(1))]},
    ...     {"params": [torch.nn.Parameter(torch.ones(1))], "adjust_learning_rate": 0.5}], lr=1.0)
    >>> sched = cstream.optim.configure_lr_scheduler(opt, 0.1, {"decoder_kernel": 0.5})
    >>> [round(float(v), 4) for v in sched.get_last_lr()]
    [0.1, 0.05]
    """
    scheduler = _configure(optimizer, learning_rate)
    if adjust_learning_rate:
        return lr_scheduler.ScalePerParamLR(optimizer, scheduler)
    return scheduler


def _configure(optimizer: Optimizer, learning_rate):
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
            return lr_scheduler.ChainedLR(scheds)
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
