"""Closed-form schedulers of a param group value (the learning rate, the weight decay, ...).

The figures are those of ``cerebras.pytorch`` 2.10 (``tests/reference/`` holds its numbers):
a scheduler keeps ``last_epoch`` as a 0-d int64 state tensor, moved from ``last_epoch`` (-1) to
0 by the constructor and by one on every ``step()``, and computes the value at ``last_epoch``
with tensor ops only (``torch.where`` for the pieces), in float32 as the real package does. No
Python branches on the step, so a traced step replays the whole schedule.

How a value reaches the optimizer: every targeted param group gets a 0-d float32 state tensor
of this scheduler (readable inside a ``@step_closure``), created by the constructor and written
in place on every step, so a traced step replays the schedule. Outside a step the group holds
that state tensor (``group[param_group_key]``; whatever it held before, a Python float or a
tensor, is replaced), so ``state_dict()`` and checkpoint closures read the current value.
Inside a step the group holds values, as in the real package, which rebinds the group entry on
every ``step()``: :func:`group_values_in_step` binds each group to a copy of the state at the
start of the step, ``step()`` binds it to the new value, and the end of the step binds the
state back. So a reference to ``group["lr"]`` taken before ``step()`` keeps the rate that step's
optimizer used. ``param_group_tags`` picks the groups by their ``tags``.
"""


import contextlib
import itertools
import math
import weakref
from abc import ABC, abstractmethod
from typing import List, Optional, Union

import numpy
import torch

from cstream.creation import state_tensor
from cstream.optim.optimizer import Optimizer
from executor import runtime

Tags = Optional[Union[str, List[Union[str, None]]]]

# backend -> {creation number: scheduler}: the schedulers whose groups a step of that backend
# binds to values (in creation order, so every trace of a step records the same ops)
_SCHEDULERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_numbers = itertools.count()


@contextlib.contextmanager
def group_values_in_step():
    """Around one step (run eagerly, or traced): the schedulers of the current backend bind
    their param groups to a copy of their state at the start and back to the state at the end
    (see the module docstring)."""
    backend = runtime.current_backend()
    by_number = _SCHEDULERS.get(backend) if backend is not None else None
    schedulers = [by_number[n] for n in sorted(by_number)] if by_number else []
    for scheduler in schedulers:
        scheduler._bind_groups(lambda held: held.clone())
    try:
        yield
    finally:
        for scheduler in schedulers:
            scheduler._bind_groups(lambda held: held)


def _state(value, dtype) -> torch.Tensor:
    return state_tensor(torch.tensor(value, dtype=dtype), readable=True)


def _tag_set(param_group_tags) -> Optional[set]:
    if param_group_tags is None:
        return None
    if isinstance(param_group_tags, (list, tuple, set, frozenset)):
        tags = set(param_group_tags)
        if len(tags) != len(param_group_tags):
            raise ValueError(
                f"param_group_tags={list(param_group_tags)!r} names a tag twice; name each "
                "tag once.")
        return tags
    return {param_group_tags}


def _group_tags(group: dict) -> set:
    tags = group.get("tags", {None})
    return {tags} if isinstance(tags, str) else set(tags)


def _f32(like: torch.Tensor, value: float) -> torch.Tensor:
    """``value`` as a float32 tensor (``torch.tensor(value)`` without a graph constant)."""
    return torch.full_like(like, value, dtype=torch.float32)


class Scheduler(ABC):
    """Base class: ``Scheduler(optimizer, total_iters, last_epoch=-1, param_group_tags=None)``.

    Subclasses name the group entry they write (:attr:`param_group_key`) and implement
    :meth:`_get_closed_form`, the value at ``self.last_epoch`` as a tensor.
    ``param_group_tags`` (a tag or a list of tags; ``[None]`` means the untagged groups)
    limits the scheduler to the groups whose ``tags`` share one.
    """

    # bookkeeping of cstream's own, left out of state_dict()
    _NOT_STATE = frozenset({"optimizer", "_epoch_offset", "_bound"})

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters: Optional[int], last_epoch: int = -1,
                 param_group_tags: Tags = None):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(self).__name__} needs a cstream.optim.Optimizer, got "
                f"{type(optimizer).__name__}; torch.optim optimizers are not traceable, use "
                "the optimizer of the same name in cstream.optim.")
        if type(self)._get_closed_form is Scheduler._get_closed_form:
            raise TypeError(
                f"{type(self).__name__} defines no schedule: implement _get_closed_form(self) "
                "(_get_closed_form_lr for a learning-rate scheduler), returning the value at "
                "self.last_epoch as a tensor made with tensor ops (torch.where for pieces).")
        self.param_group_tags = _tag_set(param_group_tags)
        self.optimizer = optimizer
        self._check_tags_apply()
        self.total_iters = total_iters
        self._epoch_offset = int(last_epoch)
        self.last_epoch = _state(int(last_epoch) + 1, torch.int64)
        self._last_value = [_state(0.0, torch.float32) if self._applies(g) else None
                            for g in optimizer.param_groups]
        self._bound = [None] * len(self._last_value)  # what this scheduler put in each group
        self._get_called_within_step = False
        self._post_init()
        self._write_last_value()
        backend = runtime.current_backend()
        if backend is not None:
            _SCHEDULERS.setdefault(backend, weakref.WeakValueDictionary())[next(_numbers)] = self

    @property
    @abstractmethod
    def param_group_key(self) -> str:
        """The param group entry this scheduler writes, e.g. ``"lr"``."""

    def _get_closed_form(self) -> torch.Tensor:
        """The value at step ``self.last_epoch`` (a 0-d float32 tensor)."""
        raise NotImplementedError

    def _post_init(self) -> None:
        """Checks of composite schedulers, once the own state exists."""

    # -- param groups ----------------------------------------------------------------------------
    def _applies(self, group: dict) -> bool:
        if self.param_group_tags is None:
            return True
        return bool(self.param_group_tags & _group_tags(group))

    def _check_tags_apply(self) -> None:
        if any(self._applies(g) for g in self.optimizer.param_groups):
            return
        known = set().union(*(_group_tags(g) for g in self.optimizer.param_groups))
        raise ValueError(
            f"{type(self).__name__}(param_group_tags={sorted(self.param_group_tags, key=str)}) "
            f"targets no param group of the optimizer: its groups are tagged "
            f"{sorted(known, key=str)} (None: untagged). Tag the groups with param group "
            "'tags', or pass tags they carry.")

    def get(self) -> list:
        """The value at ``last_epoch`` for every param group (None where not targeted)."""
        value = self._get_closed_form()
        return [value if self._applies(g) else None for g in self.optimizer.param_groups]

    @torch.no_grad()
    def _write_last_value(self, bind_value: bool = False) -> None:
        """Write the value at ``last_epoch`` into the state; bind the groups to it, or to the
        new value itself (``bind_value``: in ``step()``, as the real package rebinds them)."""
        for i, (group, value) in enumerate(zip(self.optimizer.param_groups, self.get())):
            if value is None:
                continue
            held = self._last_value[i]
            held.copy_(value)
            self._bound[i] = group[self.param_group_key] = value if bind_value else held

    def _bind_groups(self, value_of) -> None:
        """Bind every group that still holds what this scheduler put there to
        ``value_of(state)``; groups another scheduler or the user rebound are left alone."""
        for i, (group, held) in enumerate(zip(self.optimizer.param_groups, self._last_value)):
            if held is not None and group.get(self.param_group_key) is self._bound[i]:
                self._bound[i] = group[self.param_group_key] = value_of(held)

    # -- stepping --------------------------------------------------------------------------------
    @torch.no_grad()
    def increment_last_epoch(self) -> None:
        """Adds one to ``last_epoch``."""
        self.last_epoch.add_(1)

    def step(self, *args, **kwargs) -> None:
        """Advance one step and write the new value into the param groups (arguments, such as
        torch's ``epoch``, are ignored as the real package ignores them)."""
        self.increment_last_epoch()
        self._write_last_value(bind_value=True)

    def get_last_value(self) -> list:
        """The value each param group got last (0-d tensors; None for groups not targeted).
        Inside a ``@step_closure`` on CSX: the values after that closure's step."""
        return [None if v is None else v.detach().clone() for v in self._last_value]

    # -- state -----------------------------------------------------------------------------------
    def _step_count(self) -> int:
        """How many times ``step()`` ran, the constructor's first step included (1 for a
        scheduler stepped by the one that combines it; counted from ``last_epoch``, so after a
        load it counts from the loaded step)."""
        if self._epoch_offset is None:
            return 1
        return int(self.last_epoch) - self._epoch_offset

    def _stepped_by_parent(self) -> None:
        self._epoch_offset = None

    def state_dict(self) -> dict:
        """The real package's layout: every attribute but the optimizer (hyperparameters,
        ``last_epoch``, ``_last_value``, ``param_group_tags``, ``_step_count``, ...)."""
        state = {k: v for k, v in vars(self).items() if k not in self._NOT_STATE}
        state["_step_count"] = self._step_count()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what :meth:`state_dict` gave (here or in ``cerebras.pytorch``): hyperparameters
        and ``last_epoch`` are taken over, and the value at that step goes into the param
        groups, so the next optimizer step uses it."""
        state = dict(state_dict)
        for key in ("_step_count", "_get_called_within_step", "_last_value"):
            state.pop(key, None)
        tags = _tag_set(state.pop("param_group_tags", self.param_group_tags))
        if tags != self.param_group_tags:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state dict's param_group_tags "
                f"{tags} differ from this scheduler's {self.param_group_tags}; build the "
                f"scheduler with param_group_tags={sorted(tags, key=str) if tags else None}.")
        last_epoch = state.pop("last_epoch", None)
        for key, value in state.items():
            setattr(self, key, value)
        if last_epoch is not None:
            with torch.no_grad():
                self.last_epoch.copy_(torch.as_tensor(last_epoch, dtype=torch.int64))
        self._write_last_value()


class ConstantScheduler(Scheduler):
    """The value ``val`` at every step (``total_iters`` counts in a SequentialScheduler)."""

    def __init__(self, optimizer: torch.optim.Optimizer, val: float,
                 total_iters: Optional[int] = None,
                 param_group_tags: Tags = None):
        self.val = val
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        return _f32(self.last_epoch, self.val)


class PolynomialScheduler(Scheduler):
    """``(initial - end) * (1 - step / total_iters) ** power + end``, then ``end``.

    ``cycle=True`` divides by ``total_iters * ceil((step + 1) / total_iters)``, which is
    ``total_iters`` for every step before the end: as in the real package, it changes nothing.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int,
                 power: float = 1.0, cycle: bool = False, param_group_tags: Tags = None):
        self.initial_val, self.end_val = initial_val, end_val
        self.power, self.cycle = power, cycle
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        step = self.last_epoch.to(torch.float32)
        period = _f32(step, 1.0)
        if self.cycle:
            period = torch.ceil((self.last_epoch + 1) / self.total_iters)
        decayed = (1 - step / (self.total_iters * period)).pow(self.power)
        decayed = decayed.mul(self.initial_val - self.end_val).add(self.end_val)
        return torch.where(self.last_epoch >= self.total_iters, _f32(step, self.end_val), decayed)


class LinearScheduler(PolynomialScheduler):
    """PolynomialScheduler with ``power=1``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int,
                 cycle: bool = False, param_group_tags: Tags = None):
        super().__init__(optimizer, initial_val=initial_val, end_val=end_val,
                         total_iters=total_iters, power=1.0, cycle=cycle,
                         param_group_tags=param_group_tags)


class ExponentialScheduler(Scheduler):
    """``initial * decay_rate ** (step / total_iters)`` (the power floored if staircase)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, total_iters: int,
                 decay_rate: float,
                 staircase: bool = False, param_group_tags: Tags = None):
        self.initial_val = float(initial_val)
        self.decay_rate, self.staircase = decay_rate, staircase
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        power = self.last_epoch / self.total_iters
        if self.staircase:
            power = torch.floor(power)
        return torch.pow(self.decay_rate, power).mul(self.initial_val)


class InverseExponentialTimeDecayScheduler(Scheduler):
    """``initial / (1 + decay_rate * step ** step_exponent / total_iters)`` (the quotient
    floored if staircase): Keras' InverseTimeDecay with the step raised to ``step_exponent``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_exponent: int,
                 total_iters: int,
                 decay_rate: float, staircase: bool = False, param_group_tags: Tags = None):
        self.initial_val, self.step_exponent = initial_val, step_exponent
        self.decay_rate, self.staircase = decay_rate, staircase
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        alpha = self.last_epoch.to(torch.float32).pow(self.step_exponent) / self.total_iters
        if self.staircase:
            alpha = torch.floor(alpha)
        return torch.div(_f32(alpha, self.initial_val), alpha.mul(self.decay_rate).add(1.0))


class InverseSquareRootDecayScheduler(Scheduler):
    """``initial * scale / sqrt(max(step, warmup_steps))``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float = 1.0,
                 scale: float = 1.0,
                 warmup_steps: int = 1.0, param_group_tags: Tags = None):
        self.initial_val, self.scale, self.warmup_steps = initial_val, scale, warmup_steps
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        step = self.last_epoch.to(torch.float32)
        denominator = torch.sqrt(torch.maximum(_f32(step, self.warmup_steps), step))
        return torch.div(_f32(step, self.scale), denominator).mul(self.initial_val)


class CosineDecayScheduler(Scheduler):
    """``end + (initial - end) * (1 + cos(pi * min(step, total_iters) / total_iters)) / 2``
    (Keras' CosineDecay)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, end_val: float,
                 total_iters: int,
                 param_group_tags: Tags = None):
        self.initial_val, self.end_val = initial_val, end_val
        super().__init__(optimizer, total_iters=total_iters, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        step = torch.clamp(self.last_epoch.to(torch.float32), max=float(self.total_iters))
        progress = (_f32(step, math.pi) / self.total_iters).mul(step).cos().add(1).mul(0.5)
        return progress.mul(self.initial_val - self.end_val).add(self.end_val)


class _CombinedScheduler(Scheduler):
    """A scheduler made of others (``self._schedulers``): its state dict nests theirs under
    ``_schedulers``, as the real package's does."""

    def state_dict(self):
        state = super().state_dict()
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        children = state.pop("_schedulers")
        for scheduler, child in zip(self._schedulers, children):
            scheduler.load_state_dict(child)
        super().load_state_dict(state)


class SequentialScheduler(_CombinedScheduler):
    """``schedulers[i]`` from step ``milestones[i-1]`` on, each counting its own steps from 0
    there (torch's SequentialLR)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list, milestones: List[int],
                 last_epoch: int = -1,
                 param_group_tags: Tags = None):
        if isinstance(milestones, numpy.ndarray):
            milestones = milestones.tolist()
        if not isinstance(milestones, (list, tuple)) or not all(
                isinstance(m, int) and not isinstance(m, bool) for m in milestones):
            raise TypeError(f"{type(self).__name__}: milestones must be a list of integers, "
                            f"got {milestones!r}.")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"{type(self).__name__}: {len(schedulers)} schedulers need "
                f"{len(schedulers) - 1} milestones (where each one after the first starts), "
                f"got {len(milestones)}.")
        _check_same_optimizer(type(self).__name__, optimizer, schedulers)
        for scheduler in schedulers:
            scheduler._stepped_by_parent()
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        super().__init__(optimizer, total_iters=None, last_epoch=last_epoch,
                         param_group_tags=param_group_tags)

    def _post_init(self):
        _check_same_tags(self, self._schedulers)

    def _get_closed_form(self):
        value = self._schedulers[0]._get_closed_form()
        for milestone, scheduler in zip(self._milestones, self._schedulers[1:]):
            value = torch.where(self.last_epoch < milestone, value,
                                scheduler._get_closed_form())
        return value

    @torch.no_grad()
    def increment_last_epoch(self):
        super().increment_last_epoch()
        self._schedulers[0].last_epoch.add_(1)
        for milestone, scheduler in zip(self._milestones, self._schedulers[1:]):
            scheduler.last_epoch.add_((self.last_epoch > milestone).to(torch.int64))


class PiecewiseConstantScheduler(SequentialScheduler):
    """``vals[i]`` from ``milestones[i-1]`` until ``milestones[i]`` (one more value than
    milestones)."""

    def __init__(self, optimizer: torch.optim.Optimizer, constant_cls: type, vals: List[float],
                 milestones: List[int],
                 param_group_tags: Tags = None):
        if len(vals) != len(milestones) + 1:
            raise ValueError(
                f"{type(self).__name__}: {len(milestones)} milestones need {len(milestones) + 1}"
                f" values (one before the first milestone, one after each), got {len(vals)}.")
        bounds = [0, *milestones]
        schedulers = [constant_cls(optimizer, v, end - start, param_group_tags=param_group_tags)
                      for v, start, end in zip(vals, bounds[:-1], bounds[1:])]
        schedulers.append(constant_cls(optimizer, vals[-1], param_group_tags=param_group_tags))
        super().__init__(optimizer, schedulers, list(milestones),
                         param_group_tags=param_group_tags)


class MultiStepScheduler(Scheduler):
    """``initial * gamma ** (milestones reached)`` (torch's MultiStepLR)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, gamma: float,
                 milestones: List[int],
                 param_group_tags: Tags = None):
        self.initial_val, self.gamma, self.milestones = initial_val, gamma, milestones
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        value = _f32(self.last_epoch, self.initial_val)
        for milestone in self.milestones:
            value = torch.where(self.last_epoch < milestone, value,
                                _f32(value, self.gamma).mul(value))
        return value


class StepScheduler(Scheduler):
    """``initial * gamma ** floor(step / step_size)`` (torch's StepLR)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, step_size: int,
                 gamma: float,
                 param_group_tags: Tags = None):
        self.initial_val, self.gamma, self.step_size = float(initial_val), gamma, step_size
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        exponent = torch.floor(self.last_epoch / self.step_size)
        return torch.pow(_f32(exponent, self.gamma), exponent).mul(self.initial_val)


class CosineAnnealingScheduler(Scheduler):
    """``eta_min + (initial - eta_min) * (1 + cos(pi * step / T_max)) / 2``: periodic, rising
    again after ``T_max`` (torch's CosineAnnealingLR in closed form)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_max: int,
                 eta_min: float = 0.0,
                 param_group_tags: Tags = None):
        self.initial_val, self.T_max, self.eta_min = float(initial_val), float(T_max), eta_min
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        return _cosine(self.last_epoch / self.T_max, self.initial_val, self.eta_min)


def _cosine(fraction: torch.Tensor, start: float, end: float) -> torch.Tensor:
    half = fraction.mul(math.pi).cos().add(1) / 2
    return half.mul(start - end).add(end)


class LambdaScheduler(Scheduler):
    """``initial * f(step)`` for the function :meth:`set_value_lambda` returns (override it).

    It returns a list; with several functions the product ``prod(initial * f_i(step))`` is
    taken, as the real package does. The built-in pair is ``step / 30`` and ``0.95 ** step``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float,
                 param_group_tags: Tags = None):
        self.initial_val = initial_val
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def set_value_lambda(self) -> list:
        """The functions of the step (an int64 tensor), made of tensor ops."""
        return [lambda step: step / 30,
                lambda step: torch.pow(_f32(step, 0.95), step)]

    def _get_closed_form(self):
        value = _f32(self.last_epoch, 1.0)
        for fn in self.set_value_lambda():
            value = _f32(value, self.initial_val).mul(fn(self.last_epoch)).mul(value)
        return value


class CosineAnnealingWarmRestartsScheduler(Scheduler):
    """Cosine annealing from ``initial`` to ``eta_min`` over ``T_cur / T_i``, ``T_cur`` the
    steps since the last restart, ``T_i`` the period: ``T_0``, then ``T_0 * T_mult`` ...

    Deviation (docs/reference.md): the real package never restarts (after the first period
    its ``T_cur`` stays 0, so the value stays ``initial``) and refuses ``T_mult != 1``; this
    follows its docstring and torch's CosineAnnealingWarmRestarts instead.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, T_0: int,
                 T_mult: int = 1,
                 eta_min: float = 0.0, param_group_tags: Tags = None):
        if int(T_mult) != T_mult or T_mult < 1:
            raise ValueError(f"{type(self).__name__}: T_mult must be an integer >= 1 (the "
                             f"factor of each new period), got {T_mult!r}.")
        self.initial_val, self.T_0, self.T_mult = float(initial_val), T_0, T_mult
        self.eta_min = eta_min
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        step = self.last_epoch.to(torch.float32)
        if self.T_mult == 1:
            t_cur, t_i = torch.remainder(self.last_epoch, self.T_0).to(torch.float32), self.T_0
        else:
            m = float(self.T_mult)
            n = torch.floor(torch.log(step / self.T_0 * (m - 1) + 1) / math.log(m))
            t_cur = step - self.T_0 * (torch.pow(m, n) - 1) / (m - 1)
            t_i = torch.pow(m, n) * self.T_0
        return _cosine(t_cur / t_i, self.initial_val, self.eta_min)


class MultiplicativeScheduler(Scheduler):
    """``initial * coefficient ** step``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, coefficient: float,
                 param_group_tags: Tags = None):
        self.initial_val, self.coefficient = initial_val, coefficient
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _get_closed_form(self):
        return torch.pow(_f32(self.last_epoch, self.coefficient),
                         self.last_epoch).mul(self.initial_val)


class ChainedScheduler(_CombinedScheduler):
    """The first scheduler's value times every other one's relative factor
    ``value_i / initial_i``; all of them share this scheduler's step."""

    def __init__(self, schedulers: list, param_group_tags: Tags = None):
        if isinstance(schedulers, Optimizer):  # the seed-era spelling (optimizer, schedulers)
            schedulers, param_group_tags = param_group_tags, None
        if not schedulers:
            raise ValueError(f"{type(self).__name__} needs at least one scheduler.")
        self._schedulers = list(schedulers)
        for i, scheduler in enumerate(self._schedulers[1:], 1):
            if not hasattr(scheduler, "initial_val"):
                raise ValueError(
                    f"{type(self).__name__}: schedulers[{i}] ({type(scheduler).__name__}) has "
                    "no initial value to scale by; only the first scheduler may be one "
                    "without (ConstantLR, SequentialLR, ...).")
        optimizer = self._schedulers[0].optimizer
        _check_same_optimizer(type(self).__name__, optimizer, self._schedulers)
        for scheduler in self._schedulers:
            scheduler._stepped_by_parent()
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _post_init(self):
        _check_same_tags(self, self._schedulers)
        for scheduler in self._schedulers:
            scheduler.last_epoch = self.last_epoch

    def _get_closed_form(self):
        value = self._schedulers[0]._get_closed_form()
        for scheduler in self._schedulers[1:]:
            value = value.mul(scheduler._get_closed_form() / scheduler.initial_val)
        return value

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for scheduler in self._schedulers:
            scheduler.last_epoch = self.last_epoch


class CyclicScheduler(Scheduler):
    """Triangular cycles between ``base_val`` and ``max_val`` (torch's CyclicLR). The scale
    follows ``mode``: ``triangular`` (1), ``triangular2`` (halved every cycle) or
    ``exp_range`` (``gamma ** step``); as in the real package, ``mode`` decides
    ``scale_mode`` (cycle for the first two, iterations for exp_range)."""

    MODES = ("triangular", "triangular2", "exp_range")

    def __init__(self, optimizer: torch.optim.Optimizer, base_val: float, max_val: float,
                 step_size_up: int = 2000,
                 step_size_down: int = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_mode: str = "cycle", param_group_tags: Tags = None):
        if mode not in self.MODES:
            raise ValueError(f"{type(self).__name__}: mode must be one of {self.MODES}, got "
                             f"{mode!r}.")
        self.base_val, self.max_val = base_val, max_val
        self.step_size_up = step_size_up
        self.step_size_down = step_size_up if step_size_down is None else step_size_down
        self.mode, self.gamma = mode, gamma
        self.scale_mode = "iterations" if mode == "exp_range" else "cycle"
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _scale(self, x: torch.Tensor):
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return torch.div(_f32(x, 1.0), torch.pow(_f32(x, 2.0), x - 1))
        return torch.pow(_f32(x, self.gamma), x)

    def _get_closed_form(self):
        total = self.step_size_up + self.step_size_down
        ratio = self.step_size_up / total
        cycle = torch.floor((self.last_epoch / total).add(1))
        x = (self.last_epoch / total - cycle).add(1)
        height = torch.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        height = height.mul(self.max_val - self.base_val)
        at = cycle if self.scale_mode == "cycle" else self.last_epoch
        return (height * self._scale(at)).add(self.base_val)


class OneCycleScheduler(Scheduler):
    """The 1cycle policy: from ``initial_val`` up to ``max_val`` over ``pct_start`` of
    ``total_steps``, then down to ``initial_val / final_div_factor``; with ``three_phase``
    back to ``initial_val`` first. ``anneal_strategy`` is ``"cos"`` or ``"linear"``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_val: float, max_val: float,
                 total_steps: int = 1000,
                 pct_start: float = 0.3, final_div_factor: float = 1e4,
                 three_phase: bool = False, anneal_strategy: str = "cos",
                 param_group_tags: Tags = None):
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{type(self).__name__}: anneal_strategy must be 'cos' or "
                             f"'linear', got {anneal_strategy!r}.")
        self.initial_val, self.max_val = initial_val, max_val
        self.total_steps, self.pct_start = total_steps, pct_start
        self.final_div_factor, self.three_phase = final_div_factor, three_phase
        self.anneal_strategy = anneal_strategy
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _phases(self) -> list[tuple[float, float, float]]:
        """(end step, start value, end value) of each phase."""
        up_end = self.pct_start * self.total_steps - 1
        low = self.initial_val / self.final_div_factor
        if self.three_phase:
            return [(up_end, self.initial_val, self.max_val),
                    (2 * self.pct_start * self.total_steps - 2, self.max_val, self.initial_val),
                    (self.total_steps - 1, self.initial_val, low)]
        return [(up_end, self.initial_val, self.max_val),
                (self.total_steps - 1, self.max_val, low)]

    def _anneal(self, start: float, end: float, pct: torch.Tensor) -> torch.Tensor:
        if self.anneal_strategy == "cos":
            return pct.mul(math.pi).cos().add(1).mul((start - end) / 2.0).add(end)
        return pct.mul(end - start).add(start)

    def _get_closed_form(self):
        value, begin = None, 0
        for end_step, start, end in self._phases():
            phase = self._anneal(start, end, (self.last_epoch - begin) / (end_step - begin))
            value = phase if value is None else torch.where(self.last_epoch > begin, phase, value)
            begin = end_step
        return value


class ScalePerParamScheduler(Scheduler):
    """Wraps ``scheduler`` and scales its value per param group by the group's
    ``adjust_learning_rate`` (else ``adjust_val``, else 1), read at construction: the
    per-layer learning rates of muP."""

    _NOT_STATE = Scheduler._NOT_STATE | {"_scheduler_nested"}

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Scheduler,
                 param_group_tags: Tags = None):
        self.adjustment_scalars = [g.get("adjust_learning_rate", g.get("adjust_val", 1.0))
                                   for g in optimizer.param_groups]
        _check_same_optimizer(type(self).__name__, optimizer, [scheduler])
        scheduler._stepped_by_parent()
        self._scheduler_nested = scheduler
        super().__init__(optimizer, total_iters=None, param_group_tags=param_group_tags)

    def _post_init(self):
        _check_same_tags(self, [self._scheduler_nested])

    def get(self):
        value = self._get_closed_form()
        return [value * scale if self._applies(g) else None
                for g, scale in zip(self.optimizer.param_groups, self.adjustment_scalars)]

    def _get_closed_form(self):
        return self._scheduler_nested._get_closed_form()

    def increment_last_epoch(self):
        super().increment_last_epoch()
        self._scheduler_nested.increment_last_epoch()

    def state_dict(self):
        state = super().state_dict()
        state["_scheduler"] = self._scheduler_nested.state_dict()
        state["_scheduler"].pop("_get_called_within_step", None)
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        self._scheduler_nested.load_state_dict(state.pop("_scheduler"))
        super().load_state_dict(state)


def _check_same_optimizer(name: str, optimizer, schedulers) -> None:
    for i, scheduler in enumerate(schedulers):
        if scheduler.optimizer is not optimizer:
            raise ValueError(f"{name}: schedulers[{i}] belongs to another optimizer; every "
                             "scheduler it combines must schedule the same optimizer.")


def _check_same_tags(outer: Scheduler, schedulers) -> None:
    for i, scheduler in enumerate(schedulers):
        if scheduler.param_group_tags != outer.param_group_tags:
            raise ValueError(
                f"{type(outer).__name__}(param_group_tags={outer.param_group_tags}): the "
                f"scheduler at index {i} has param_group_tags={scheduler.param_group_tags}; "
                "give every combined scheduler the same param_group_tags.")
