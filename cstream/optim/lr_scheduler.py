"""Learning-rate schedulers: ``cerebras.pytorch.optim.lr_scheduler``'s classes, signatures,
figures and state dicts (see :mod:`cstream.optim.scheduler` for how they work).

Each ``*LR`` class is the generic scheduler of :mod:`cstream.optim.scheduler` writing the
group's ``"lr"``, with the learning-rate names of its arguments (``initial_learning_rate``,
``end_learning_rate``, ``base_lr``, ...), which are also the names its state dict uses.

A custom scheduler subclasses :class:`LRScheduler` and implements ``_get_closed_form_lr``
(Cerebras' porting guide) or ``_get_closed_form`` (the real package's name), with tensor ops only:

>>> import torch, cstream
>>> class Halving(cstream.optim.lr_scheduler.LRScheduler):
...     def __init__(self, optimizer: torch.optim.Optimizer):
...         super().__init__(optimizer, total_iters=None, last_epoch=-1)
...     def _get_closed_form_lr(self):
...         return 0.5 ** self.last_epoch.to(torch.float32)
>>> opt = cstream.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
>>> sched = Halving(opt)
>>> sched.step(); sched.step()
>>> [round(float(v), 4) for v in sched.get_last_lr()]
[0.25]
"""


from typing import Callable, List, Optional

import torch

from cstream.optim import scheduler as _s
from cstream.optim.scheduler import (  # noqa: F401  (the real module exports them too)
    ChainedScheduler as BaseChainedScheduler,
    ConstantScheduler, CosineAnnealingScheduler, CosineAnnealingWarmRestartsScheduler,
    CosineDecayScheduler, CyclicScheduler, ExponentialScheduler,
    InverseExponentialTimeDecayScheduler, InverseSquareRootDecayScheduler, LambdaScheduler,
    LinearScheduler, MultiplicativeScheduler, MultiStepScheduler, OneCycleScheduler,
    PiecewiseConstantScheduler, PolynomialScheduler, ScalePerParamScheduler, Scheduler,
    SequentialScheduler, StepScheduler, Tags,
)


def _alias(name: str) -> property:
    """A generic argument (``initial_val``) kept under its learning-rate name."""
    return property(lambda self: getattr(self, name),
                    lambda self, value: setattr(self, name, value))


def _closed_form_from_lr(self) -> torch.Tensor:
    return torch.as_tensor(self._get_closed_form_lr(), dtype=torch.float32)


class LRScheduler(Scheduler, torch.optim.lr_scheduler.LRScheduler):
    """Base class: ``LRScheduler(optimizer, total_iters=None, last_epoch=-1,
    param_group_tags=None)``; implement ``_get_closed_form_lr`` (or ``_get_closed_form``)."""

    param_group_key = "lr"

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters: Optional[int] = None,
                 last_epoch: int = -1,
                 param_group_tags: Tags = None):
        super().__init__(optimizer, total_iters, last_epoch, param_group_tags)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_get_closed_form_lr" in cls.__dict__ and "_get_closed_form" not in cls.__dict__:
            cls._get_closed_form = _closed_form_from_lr

    def _get_closed_form_lr(self) -> torch.Tensor:
        """The learning rate at ``self.last_epoch`` (the porting guide's name for the schedule)."""
        raise NotImplementedError

    def get_last_lr(self) -> list:
        """The learning rate each param group got last (see :meth:`get_last_value`)."""
        return self.get_last_value()

    def get_lr(self) -> list:
        return self.get()


class ConstantLR(LRScheduler, ConstantScheduler):
    """``learning_rate`` at every step."""

    val = _alias("learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: float,
                 total_iters: Optional[int] = None,
                 param_group_tags: Tags = None):
        ConstantScheduler.__init__(self, optimizer, val=learning_rate, total_iters=total_iters,
                                   param_group_tags=param_group_tags)


class PolynomialLR(LRScheduler, PolynomialScheduler):
    """From ``initial_learning_rate`` to ``end_learning_rate`` over ``total_iters`` steps
    along ``(1 - step / total_iters) ** power``."""

    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 end_learning_rate: float,
                 total_iters: int, power: float = 1.0, cycle: bool = False,
                 param_group_tags: Tags = None):
        PolynomialScheduler.__init__(self, optimizer, initial_learning_rate, end_learning_rate,
                                     total_iters, power=power, cycle=cycle,
                                     param_group_tags=param_group_tags)


class LinearLR(LRScheduler, LinearScheduler):
    """PolynomialLR with ``power=1``."""

    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 end_learning_rate: float,
                 total_iters: int, cycle: bool = False, param_group_tags: Tags = None):
        LinearScheduler.__init__(self, optimizer, initial_learning_rate, end_learning_rate,
                                 total_iters, cycle=cycle, param_group_tags=param_group_tags)


class ExponentialLR(LRScheduler, ExponentialScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 total_iters: int,
                 decay_rate: float, staircase: bool = False, param_group_tags: Tags = None):
        ExponentialScheduler.__init__(self, optimizer, initial_learning_rate, total_iters,
                                      decay_rate, staircase=staircase,
                                      param_group_tags=param_group_tags)


class InverseExponentialTimeDecayLR(LRScheduler, InverseExponentialTimeDecayScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 step_exponent: int,
                 total_iters: int, decay_rate: float, staircase: bool = False,
                 param_group_tags: Tags = None):
        InverseExponentialTimeDecayScheduler.__init__(
            self, optimizer, initial_learning_rate, step_exponent, total_iters, decay_rate,
            staircase=staircase, param_group_tags=param_group_tags)


class InverseSquareRootDecayLR(LRScheduler, InverseSquareRootDecayScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float = 1.0,
                 scale: float = 1.0,
                 warmup_steps: int = 1.0, param_group_tags: Tags = None):
        InverseSquareRootDecayScheduler.__init__(self, optimizer, initial_learning_rate, scale,
                                                 warmup_steps, param_group_tags=param_group_tags)


class CosineDecayLR(LRScheduler, CosineDecayScheduler):
    initial_val = _alias("initial_learning_rate")
    end_val = _alias("end_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 end_learning_rate: float,
                 total_iters: int, param_group_tags: Tags = None):
        CosineDecayScheduler.__init__(self, optimizer, initial_learning_rate, end_learning_rate,
                                      total_iters, param_group_tags=param_group_tags)


class SequentialLR(LRScheduler, SequentialScheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: List[LRScheduler],
                 milestones: List[int],
                 last_epoch: int = -1, param_group_tags: Tags = None):
        SequentialScheduler.__init__(self, optimizer, schedulers, milestones,
                                     last_epoch=last_epoch, param_group_tags=param_group_tags)


class PiecewiseConstantLR(LRScheduler, PiecewiseConstantScheduler):
    """``learning_rates[i]`` from ``milestones[i-1]`` until ``milestones[i]``."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: List[float],
                 milestones: List[int],
                 param_group_tags: Tags = None):
        PiecewiseConstantScheduler.__init__(self, optimizer, ConstantLR, learning_rates,
                                            milestones, param_group_tags=param_group_tags)


class MultiStepLR(LRScheduler, MultiStepScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, gamma: float,
                 milestones: List[int], param_group_tags: Tags = None):
        MultiStepScheduler.__init__(self, optimizer, initial_learning_rate, gamma, milestones,
                                    param_group_tags=param_group_tags)


class StepLR(LRScheduler, StepScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 step_size: int, gamma: float,
                 param_group_tags: Tags = None):
        StepScheduler.__init__(self, optimizer, initial_learning_rate, step_size, gamma,
                               param_group_tags=param_group_tags)


class CosineAnnealingLR(LRScheduler, CosineAnnealingScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_max: int,
                 eta_min: float = 0.0, param_group_tags: Tags = None):
        CosineAnnealingScheduler.__init__(self, optimizer, initial_learning_rate, T_max,
                                          eta_min=eta_min, param_group_tags=param_group_tags)


class LambdaLR(LRScheduler, LambdaScheduler):
    """``initial_learning_rate * f(step)`` for each ``f`` of :meth:`set_value_lambda` (the
    real package's built-in pair unless overridden). ``lr_lambda``, a cstream extension, is a
    single function of the step (an int64 tensor) made of tensor ops, used instead."""

    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 param_group_tags: Tags = None,
                 lr_lambda: Optional[Callable] = None):
        if lr_lambda is not None and not callable(lr_lambda):
            raise TypeError(f"LambdaLR: lr_lambda must be a function of the step, got "
                            f"{type(lr_lambda).__name__}.")
        self.lr_lambda = lr_lambda
        LambdaScheduler.__init__(self, optimizer, initial_learning_rate,
                                 param_group_tags=param_group_tags)

    def set_value_lambda(self) -> list:
        if self.lr_lambda is not None:
            return [self.lr_lambda]
        return super().set_value_lambda()

    def state_dict(self):
        state = super().state_dict()
        state.pop("lr_lambda")  # a function: the real package's state has no such key
        return state


class CosineAnnealingWarmRestarts(LRScheduler, CosineAnnealingWarmRestartsScheduler):
    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_0: int,
                 T_mult: int = 1,
                 eta_min: float = 0.0, param_group_tags: Tags = None):
        CosineAnnealingWarmRestartsScheduler.__init__(
            self, optimizer, initial_learning_rate, T_0, T_mult=T_mult, eta_min=eta_min,
            param_group_tags=param_group_tags)


class MultiplicativeLR(LRScheduler, MultiplicativeScheduler):
    """``initial_learning_rate * coefficient ** step``."""

    initial_val = _alias("initial_learning_rate")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 coefficient: float,
                 param_group_tags: Tags = None):
        MultiplicativeScheduler.__init__(self, optimizer, initial_learning_rate, coefficient,
                                         param_group_tags=param_group_tags)


class ChainedLR(LRScheduler, BaseChainedScheduler):
    """The first scheduler's rate times each other one's ``rate / initial_learning_rate``.
    ``ChainedLR(schedulers)``; the seed-era ``ChainedLR(optimizer, schedulers)`` also works."""

    def __init__(self, schedulers: List[LRScheduler], param_group_tags: Tags = None):
        BaseChainedScheduler.__init__(self, schedulers, param_group_tags=param_group_tags)


class ChainedScheduler(ChainedLR):
    """torch's name for :class:`ChainedLR`."""


class CyclicLR(LRScheduler, CyclicScheduler):
    base_val = _alias("base_lr")
    max_val = _alias("max_lr")

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, max_lr: float,
                 step_size_up: int = 2000,
                 step_size_down: Optional[int] = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_mode: str = "cycle", param_group_tags: Tags = None):
        CyclicScheduler.__init__(self, optimizer, base_lr, max_lr, step_size_up=step_size_up,
                                 step_size_down=step_size_down, mode=mode, gamma=gamma,
                                 scale_mode=scale_mode, param_group_tags=param_group_tags)


class OneCycleLR(LRScheduler, OneCycleScheduler):
    """``initial_learning_rate`` is torch's ``max_lr / div_factor``."""

    initial_val = _alias("initial_learning_rate")
    max_val = _alias("max_lr")

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float,
                 max_lr: float,
                 total_steps: int = 1000, pct_start: float = 0.3,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 anneal_strategy: str = "cos", param_group_tags: Tags = None):
        OneCycleScheduler.__init__(
            self, optimizer, initial_learning_rate, max_lr, total_steps=total_steps,
            pct_start=pct_start, final_div_factor=final_div_factor, three_phase=three_phase,
            anneal_strategy=anneal_strategy, param_group_tags=param_group_tags)


class ScalePerParamLR(LRScheduler, ScalePerParamScheduler):
    """``scheduler``'s rate times each param group's ``adjust_learning_rate`` (muP)."""

    adjustment_scalars = _alias("lr_adjustment_scalars")

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 param_group_tags: Tags = None):
        ScalePerParamScheduler.__init__(self, optimizer, scheduler,
                                        param_group_tags=param_group_tags)


SCHEDULERS = {
    cls.__name__: cls for cls in (
        ConstantLR, PolynomialLR, LinearLR, ExponentialLR, InverseExponentialTimeDecayLR,
        InverseSquareRootDecayLR, CosineDecayLR, SequentialLR, PiecewiseConstantLR, MultiStepLR,
        StepLR, CosineAnnealingLR, LambdaLR, CosineAnnealingWarmRestarts, MultiplicativeLR,
        ChainedLR, ChainedScheduler, CyclicLR, OneCycleLR, ScalePerParamLR)
}

__all__ = ["LRScheduler", "Scheduler", "SCHEDULERS", *SCHEDULERS, "BaseChainedScheduler",
           *(name for name in dir(_s) if name.endswith("Scheduler") and name != "Scheduler"
             and name != "ChainedScheduler")]
