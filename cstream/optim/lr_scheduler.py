"""Closed-form learning-rate schedulers: the whole schedule as tensor ops of the step.

A scheduler keeps ``last_epoch`` as a 0-d tensor (torch's convention: the constructor moves it
from -1 to 0, so the first optimizer step uses the rate at step 0; every ``step()`` adds one) and
writes ``_get_closed_form_lr()`` into each group's ``lr`` tensor in place. No Python branches on
the step: the schedule traces into a static graph.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Callable, Optional, Sequence

import torch

import cstream
from cstream.optim.optimizer import Optimizer


class LRScheduler(ABC):
    """Base class: ``LRScheduler(optimizer, total_iters=None, last_epoch=-1)``.

    Subclasses implement :meth:`_get_closed_form_lr`, returning the rate at ``self.last_epoch``
    (a tensor) with tensor ops only (``torch.where`` for the pieces of a schedule).
    """

    def __init__(self, optimizer: Optimizer, total_iters: Optional[int] = None,
                 last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(self).__name__} needs a cstream.optim.Optimizer, got "
                f"{type(optimizer).__name__}; torch.optim optimizers are not traceable.")
        self.optimizer = optimizer
        self.total_iters = total_iters
        self.last_epoch = cstream.full((), float(last_epoch), dtype=torch.float32)
        self._step_lr()

    @abstractmethod
    def _get_closed_form_lr(self) -> torch.Tensor:
        """The learning rate at step ``self.last_epoch`` (a 0-d tensor)."""

    def lr_at(self, step: torch.Tensor) -> torch.Tensor:
        """The rate at ``step`` (used by SequentialLR/ChainedLR to compose schedules)."""
        saved = self.last_epoch
        self.last_epoch = step
        try:
            return torch.as_tensor(self._get_closed_form_lr(), dtype=torch.float64)
        finally:
            self.last_epoch = saved

    @torch.no_grad()
    def _step_lr(self) -> None:
        self.last_epoch.add_(1)
        lr = torch.as_tensor(self._get_closed_form_lr(), dtype=torch.float32)
        for group in self.optimizer.param_groups:
            group["lr"].copy_(lr)

    def step(self, epoch=None) -> None:
        if epoch is not None:
            raise TypeError(f"{type(self).__name__}.step() takes no epoch: the schedule is a "
                            "function of the step counter.")
        self._step_lr()

    def get_last_lr(self) -> list[float]:
        """The current rate of each group (reads values: call it outside the traced step)."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        with torch.no_grad():
            self.last_epoch.copy_(torch.as_tensor(state_dict["last_epoch"], dtype=torch.float32))
            lr = torch.as_tensor(self._get_closed_form_lr(), dtype=torch.float32)
            for group in self.optimizer.param_groups:
                group["lr"].copy_(lr)


def _t(step):
    return step.to(torch.float64)  # schedules in double precision, stored as float32


class ConstantLR(LRScheduler):
    def __init__(self, optimizer, learning_rate: float, total_iters=None, last_epoch=-1):
        self.learning_rate = float(learning_rate)
        super().__init__(optimizer, total_iters, last_epoch)

    def _get_closed_form_lr(self):
        return torch.zeros_like(self.last_epoch) + self.learning_rate


class LinearLR(LRScheduler):
    """From ``initial_learning_rate`` to ``end_learning_rate`` over ``total_iters`` steps."""

    def __init__(self, optimizer, initial_learning_rate, end_learning_rate, total_iters,
                 last_epoch=-1):
        self.initial_learning_rate = float(initial_learning_rate)
        self.end_learning_rate = float(end_learning_rate)
        super().__init__(optimizer, int(total_iters), last_epoch)

    def _get_closed_form_lr(self):
        frac = torch.clamp(_t(self.last_epoch), max=self.total_iters) / self.total_iters
        return self.initial_learning_rate + (self.end_learning_rate - self.initial_learning_rate) * frac


class PolynomialLR(LRScheduler):
    def __init__(self, optimizer, initial_learning_rate, end_learning_rate, total_iters,
                 power=1.0, cycle=False, last_epoch=-1):
        self.initial_learning_rate = float(initial_learning_rate)
        self.end_learning_rate = float(end_learning_rate)
        self.power, self.cycle = float(power), bool(cycle)
        super().__init__(optimizer, int(total_iters), last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        if self.cycle:
            decay = self.total_iters * torch.clamp(torch.ceil(step / self.total_iters), min=1.0)
            frac = step / decay
        else:
            frac = torch.clamp(step, max=self.total_iters) / self.total_iters
        return ((self.initial_learning_rate - self.end_learning_rate) * (1 - frac) ** self.power
                + self.end_learning_rate)


class CosineDecayLR(LRScheduler):
    def __init__(self, optimizer, initial_learning_rate, end_learning_rate, total_iters,
                 last_epoch=-1):
        self.initial_learning_rate = float(initial_learning_rate)
        self.end_learning_rate = float(end_learning_rate)
        super().__init__(optimizer, int(total_iters), last_epoch)

    def _get_closed_form_lr(self):
        frac = torch.clamp(_t(self.last_epoch), max=self.total_iters) / self.total_iters
        return self.end_learning_rate + (self.initial_learning_rate - self.end_learning_rate) * (
            0.5 * (1 + torch.cos(math.pi * frac)))


class ExponentialLR(LRScheduler):
    """``initial_learning_rate * decay_rate ** (step / total_iters)`` (floored if staircase)."""

    def __init__(self, optimizer, initial_learning_rate, total_iters, decay_rate,
                 staircase=False, last_epoch=-1):
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_rate, self.staircase = float(decay_rate), bool(staircase)
        super().__init__(optimizer, int(total_iters), last_epoch)

    def _get_closed_form_lr(self):
        power = _t(self.last_epoch) / self.total_iters
        if self.staircase:
            power = torch.floor(power)
        return self.initial_learning_rate * torch.pow(self.decay_rate, power)


class InverseExponentialTimeDecayLR(LRScheduler):
    """``initial / (1 + decay_rate * step / step_exponent)`` (floored if staircase)."""

    def __init__(self, optimizer, initial_learning_rate, step_exponent, total_iters, decay_rate,
                 staircase=False, last_epoch=-1):
        self.initial_learning_rate = float(initial_learning_rate)
        self.step_exponent, self.decay_rate = int(step_exponent), float(decay_rate)
        self.staircase = bool(staircase)
        super().__init__(optimizer, int(total_iters), last_epoch)

    def _get_closed_form_lr(self):
        frac = _t(self.last_epoch) / self.step_exponent
        if self.staircase:
            frac = torch.floor(frac)
        return self.initial_learning_rate / (1.0 + self.decay_rate * frac)


class InverseSquareRootDecayLR(LRScheduler):
    """``initial * scale / sqrt(max(step, warmup_steps))``."""

    def __init__(self, optimizer, initial_learning_rate=1.0, scale=1.0, warmup_steps=1.0,
                 last_epoch=-1):
        self.initial_learning_rate, self.scale = float(initial_learning_rate), float(scale)
        self.warmup_steps = float(warmup_steps)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        return self.initial_learning_rate * self.scale / torch.sqrt(
            torch.clamp(_t(self.last_epoch), min=self.warmup_steps))


class StepLR(LRScheduler):
    """``initial * gamma ** floor(step / step_size)`` (``torch.optim.lr_scheduler.StepLR``)."""

    def __init__(self, optimizer, initial_learning_rate, step_size, gamma=0.1, last_epoch=-1):
        self.initial_learning_rate, self.step_size = float(initial_learning_rate), int(step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        return self.initial_learning_rate * torch.pow(
            self.gamma, torch.floor(_t(self.last_epoch) / self.step_size))


class MultiStepLR(LRScheduler):
    """``initial * gamma ** (milestones passed)`` (``torch.optim.lr_scheduler.MultiStepLR``)."""

    def __init__(self, optimizer, initial_learning_rate, milestones: Sequence[int], gamma=0.1,
                 last_epoch=-1):
        self.initial_learning_rate = float(initial_learning_rate)
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        passed = torch.zeros_like(step)
        for m in self.milestones:
            passed = passed + (step >= m).to(torch.float32)
        return self.initial_learning_rate * torch.pow(self.gamma, passed)


class PiecewiseConstantLR(LRScheduler):
    """``learning_rates[i]`` between ``milestones[i-1]`` and ``milestones[i]``."""

    def __init__(self, optimizer, learning_rates: Sequence[float], milestones: Sequence[int],
                 last_epoch=-1):
        if len(learning_rates) != len(milestones) + 1:
            raise ValueError(
                f"PiecewiseConstantLR: learning_rates needs one more entry than milestones "
                f"(got {len(learning_rates)} rates and {len(milestones)} milestones).")
        self.learning_rates = [float(x) for x in learning_rates]
        self.milestones = [int(m) for m in milestones]
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        lr = torch.zeros_like(step) + self.learning_rates[-1]
        for m, rate in reversed(list(zip(self.milestones, self.learning_rates))):
            lr = torch.where(step < m, rate, lr)
        return lr


class CosineAnnealingLR(LRScheduler):
    """``torch.optim.lr_scheduler.CosineAnnealingLR``'s closed form (periodic in ``2*T_max``)."""

    def __init__(self, optimizer, initial_learning_rate, T_max, eta_min=0.0, last_epoch=-1):
        self.initial_learning_rate, self.T_max = float(initial_learning_rate), int(T_max)
        self.eta_min = float(eta_min)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        return self.eta_min + (self.initial_learning_rate - self.eta_min) * (
            1 + torch.cos(math.pi * _t(self.last_epoch) / self.T_max)) / 2


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted after ``T_0``, ``T_0 * T_mult``, ... steps."""

    def __init__(self, optimizer, initial_learning_rate, T_0, T_mult=1, eta_min=0.0,
                 last_epoch=-1):
        if int(T_mult) < 1:
            raise ValueError(f"CosineAnnealingWarmRestarts: T_mult must be >= 1, got {T_mult!r}.")
        self.initial_learning_rate, self.T_0 = float(initial_learning_rate), int(T_0)
        self.T_mult, self.eta_min = int(T_mult), float(eta_min)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        if self.T_mult == 1:
            t_cur, t_i = torch.remainder(step, self.T_0), torch.full_like(step, self.T_0)
        else:
            m = self.T_mult
            n = torch.floor(torch.log(step / self.T_0 * (m - 1) + 1) / math.log(m))
            start = self.T_0 * (torch.pow(m, n) - 1) / (m - 1)
            t_cur, t_i = step - start, self.T_0 * torch.pow(m, n)
        return self.eta_min + (self.initial_learning_rate - self.eta_min) * (
            1 + torch.cos(math.pi * t_cur / t_i)) / 2


class LambdaLR(LRScheduler):
    """``initial * lr_lambda(step)``; ``lr_lambda`` must be made of tensor ops."""

    def __init__(self, optimizer, initial_learning_rate, lr_lambda: Callable, last_epoch=-1):
        self.initial_learning_rate, self.lr_lambda = float(initial_learning_rate), lr_lambda
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        return self.initial_learning_rate * self.lr_lambda(_t(self.last_epoch))


class MultiplicativeLR(LRScheduler):
    """Multiplies the current rate by ``lr_lambda(step)`` every step (from step 1)."""

    def __init__(self, optimizer, initial_learning_rate, lr_lambda: Callable, last_epoch=-1):
        self.initial_learning_rate, self.lr_lambda = float(initial_learning_rate), lr_lambda
        self.current = cstream.full((), float(initial_learning_rate), dtype=torch.float64)
        super().__init__(optimizer, None, last_epoch)

    @torch.no_grad()
    def _step_lr(self):
        self.last_epoch.add_(1)
        step = _t(self.last_epoch)
        factor = torch.as_tensor(self.lr_lambda(step), dtype=torch.float64)
        self.current.copy_(torch.where(step > 0, self.current * factor, self.current))
        for group in self.optimizer.param_groups:
            group["lr"].copy_(self.current.to(torch.float32))

    def _get_closed_form_lr(self):
        return self.current.to(torch.float32)

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "current": self.current}

    def load_state_dict(self, state_dict):
        with torch.no_grad():
            self.current.copy_(torch.as_tensor(state_dict["current"]))
        super().load_state_dict(state_dict)


class CyclicLR(LRScheduler):
    """Triangular cycles between ``base_lr`` and ``max_lr`` (modes: triangular, triangular2,
    exp_range), as ``torch.optim.lr_scheduler.CyclicLR``."""

    def __init__(self, optimizer, base_lr, max_lr, step_size_up=2000, step_size_down=None,
                 mode="triangular", gamma=1.0, last_epoch=-1):
        if mode not in ("triangular", "triangular2", "exp_range"):
            raise ValueError(f"CyclicLR: mode must be triangular, triangular2 or exp_range, got "
                             f"{mode!r}.")
        self.base_lr, self.max_lr = float(base_lr), float(max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size, self.step_ratio = up + down, up / (up + down)
        self.mode, self.gamma = mode, float(gamma)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        cycle = torch.floor(1 + step / self.total_size)
        x = 1.0 + step / self.total_size - cycle
        scale = torch.where(x <= self.step_ratio, x / self.step_ratio,
                            (x - 1) / (self.step_ratio - 1))
        height = (self.max_lr - self.base_lr) * scale
        if self.mode == "triangular":
            return self.base_lr + height
        if self.mode == "triangular2":
            return self.base_lr + height / torch.pow(2.0, cycle - 1)
        return self.base_lr + height * torch.pow(self.gamma, step)


class OneCycleLR(LRScheduler):
    """Warm-up from ``initial_learning_rate`` to ``max_lr`` then anneal to ``min_lr``
    (cosine or linear), as the two-phase ``torch.optim.lr_scheduler.OneCycleLR``."""

    def __init__(self, optimizer, initial_learning_rate, max_lr, total_steps, pct_start=0.3,
                 final_div_factor=1e4, anneal_strategy="cos", last_epoch=-1):
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}.")
        self.initial_learning_rate, self.max_lr = float(initial_learning_rate), float(max_lr)
        self.min_lr = self.initial_learning_rate / float(final_div_factor)
        self.up_end = float(pct_start * total_steps) - 1
        self.down_end = float(total_steps) - 1
        self.anneal = anneal_strategy
        super().__init__(optimizer, int(total_steps), last_epoch)

    def _anneal(self, start, end, pct):
        if self.anneal == "cos":
            return end + (start - end) / 2.0 * (torch.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        up = self._anneal(self.initial_learning_rate, self.max_lr, step / self.up_end)
        down = self._anneal(self.max_lr, self.min_lr,
                            (step - self.up_end) / (self.down_end - self.up_end))
        return torch.where(step <= self.up_end, up, down)


class SequentialLR(LRScheduler):
    """Run ``schedulers[i]`` from ``milestones[i-1]``; each sees its own step counted from 0."""

    def __init__(self, optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch=-1):
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR: expected {len(schedulers) - 1} milestones for {len(schedulers)} "
                f"schedulers, got {len(milestones)}.")
        self.schedulers, self.milestones = list(schedulers), [int(m) for m in milestones]
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        starts = [0] + self.milestones
        lr = self.schedulers[-1].lr_at(step - starts[-1])
        for sched, start, end in reversed(list(zip(self.schedulers, starts, self.milestones))):
            lr = torch.where(step < end, sched.lr_at(step - start), lr)
        return lr


class ChainedLR(LRScheduler):
    """The product of the schedules' rates relative to the first one's initial rate: each
    scheduler multiplies the rate by its own factor (torch's ChainedScheduler)."""

    def __init__(self, optimizer, schedulers: Sequence[LRScheduler], last_epoch=-1):
        self.schedulers = list(schedulers)
        super().__init__(optimizer, None, last_epoch)

    def _get_closed_form_lr(self):
        step = _t(self.last_epoch)
        first = self.schedulers[0]
        lr = first.lr_at(step)
        for s in self.schedulers[1:]:
            base = s.lr_at(torch.zeros_like(step))
            lr = lr * s.lr_at(step) / base
        return lr


SCHEDULERS = {
    cls.__name__: cls for cls in (
        ConstantLR, PolynomialLR, LinearLR, ExponentialLR, InverseExponentialTimeDecayLR,
        InverseSquareRootDecayLR, CosineDecayLR, SequentialLR, PiecewiseConstantLR, MultiStepLR,
        StepLR, CosineAnnealingLR, LambdaLR, CosineAnnealingWarmRestarts, MultiplicativeLR,
        ChainedLR, CyclicLR, OneCycleLR)
}
