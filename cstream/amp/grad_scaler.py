"""GradScaler and optimizer_step: loss scaling whose overflow check and scale update are tensor
ops (they trace into the step's graph), with the rules of ``cerebras.pytorch`` 2.10's CSX runs."""

from __future__ import annotations

import weakref
from typing import Optional, Union

import torch

from cstream import creation
from cstream.optim.optimizer import group_tensors
from executor import runtime
from workers.torch_compat import foreach

_CONDITIONAL_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""The optimizers inside a step run by a dynamic GradScaler: optimizer -> (this step's
gradients are finite, the (tensor, copy) pairs ``update_if_finite`` marked)."""

DEFAULT_MAX_LOSS_SCALE = 2.0 ** 15
DEFAULT_MIN_LOSS_SCALE = 2.0 ** -14


class GradScaler:
    """Static (``loss_scale`` a number) or dynamic (``loss_scale="dynamic"``) loss scaling.

    Dynamic scaling checks the unscaled gradients' global L2 norm: a step whose norm is not
    finite (an inf/NaN gradient, or squares that overflow float32) is skipped (parameters and
    optimizer state keep their values) and counted as an overflow. After each step
    ``steps_since_rescale`` counts up; when ``overflows / steps`` exceeds ``overflow_tolerance``
    the scale halves and both counters restart; when ``steps`` exceeds ``steps_per_increase``
    the scale doubles and both restart. The scale stays within
    ``[min_loss_scale, max_loss_scale]``. With ``max_gradient_norm`` the gradients are also
    clipped to that global norm (torch's ``clip_grad_norm_`` rule) before the step.

    Numbers left out or 0 take the defaults: ``init_scale`` and ``max_loss_scale`` 2**15,
    ``min_loss_scale`` 2**-14, ``steps_per_increase`` 2000; ``loss_scale`` 0 means 1.0 (no
    scaling).
    """

    def __init__(self, loss_scale: Union[str, float] = 0.0, init_scale: Optional[float] = None,
                 steps_per_increase: Optional[int] = None, min_loss_scale: Optional[float] = None,
                 max_loss_scale: Optional[float] = None, overflow_tolerance: float = 0.05,
                 max_gradient_norm: Optional[float] = None):
        if loss_scale != "dynamic" and (isinstance(loss_scale, bool) or not isinstance(
                loss_scale, (int, float, type(None)))):
            raise ValueError(
                f"GradScaler: loss_scale must be a number (static scaling) or 'dynamic', got "
                f"{loss_scale!r}.")
        loss_scale = loss_scale or 1.0
        init_scale = init_scale or DEFAULT_MAX_LOSS_SCALE
        self._steps_per_increase = int(steps_per_increase or 2000)
        self._min_loss_scale = float(min_loss_scale or DEFAULT_MIN_LOSS_SCALE)
        self._max_loss_scale = float(max_loss_scale or DEFAULT_MAX_LOSS_SCALE)
        self.dynamic = loss_scale == "dynamic"
        self._overflow_tolerance = float(overflow_tolerance)
        self._max_gradient_norm = max_gradient_norm if self.dynamic else None
        if self.dynamic:
            if self._min_loss_scale < DEFAULT_MIN_LOSS_SCALE:
                raise ValueError(
                    f"GradScaler: min_loss_scale {self._min_loss_scale} is below 2**-14, the "
                    "smallest scale dynamic loss scaling allows.")
            if self._overflow_tolerance < 0:
                raise ValueError(f"GradScaler: overflow_tolerance must be >= 0, got "
                                 f"{overflow_tolerance!r}.")
            self._loss_scale = creation.full((), min(self._max_loss_scale, float(init_scale)),
                                            dtype=torch.float32)
            self._steps_since_rescale = creation.zeros((), dtype=torch.int64)
            self._overflows_since_rescale = creation.zeros((), dtype=torch.int64)
            self._num_skipped_steps = creation.zeros((), dtype=torch.int64)
        else:
            self._loss_scale = float(loss_scale)
        self._squared_local_norms: list = []
        self._non_clamped_loss_scale = None
        self.isfinite = None
        self._unscaled: dict = {}  # id -> optimizer, unscaled since the last update()
        self._stepped: set = set()

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self, destination=None) -> dict:
        if not self.dynamic:
            return {"loss_scale": self._loss_scale}
        return {"loss_scale": self._loss_scale,
                "steps_since_rescale": self._steps_since_rescale,
                "overflows_since_rescale": self._overflows_since_rescale,
                "num_skipped_steps": self._num_skipped_steps}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Loads the keys present (a static scaler's scale stays a number)."""
        for name, value in state_dict.items():
            current = getattr(self, f"_{name}", None)
            if isinstance(current, torch.Tensor):
                current.copy_(torch.as_tensor(value, dtype=current.dtype))
            elif name == "loss_scale":
                self._loss_scale = float(value)

    def get_scale(self):
        """The loss scale: a float32 0-d tensor when dynamic, the number when static."""
        return self._loss_scale

    def get_non_clamped_scale(self):
        """The scale of the last update before it was clamped to ``min_loss_scale``."""
        if self.dynamic and self._non_clamped_loss_scale is not None:
            return self._non_clamped_loss_scale
        return self._loss_scale

    def get_num_skipped_steps(self) -> torch.Tensor:
        """How many optimizer steps were skipped for non-finite gradients (int64 tensor)."""
        if self.dynamic:
            return self._num_skipped_steps
        backend = runtime.current_backend()  # a static scaler skips none: 0, on the device
        return torch.zeros((), dtype=torch.int64,
                           device=None if backend is None else backend.device.torch_device)

    # -- the step ---------------------------------------------------------------------------------
    def _no_scaling(self) -> bool:
        return not self.dynamic and self._loss_scale == 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` in float32 times the scale."""
        if self._no_scaling():
            return loss.float()
        return loss.float() * self._loss_scale

    @torch.no_grad()
    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale (once per step; later calls do
        nothing); dynamic scaling also records their squared norms for the overflow check."""
        if id(optimizer) in self._stepped:
            raise RuntimeError("GradScaler.unscale_() is being called after step(); call it "
                               "between backward() and step().")
        if id(optimizer) in self._unscaled:
            return
        self._unscaled[id(optimizer)] = optimizer
        if self._no_scaling():
            return
        grads = [p.grad for p in _params(optimizer) if p.grad is not None]
        inv_scale = 1.0 / self._loss_scale  # float32 (a Python number when static)
        for group, _ in group_tensors(grads):
            foreach.mul_(group, inv_scale)
        if self.dynamic:
            self._squared_local_norms.extend(torch.sum(g * g) for g in grads)

    @torch.no_grad()
    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless done), then ``optimizer.step()``; a dynamic scaler keeps the old
        parameters and state where the gradients' global norm is not finite."""
        if id(optimizer) in self._stepped:
            raise RuntimeError("GradScaler.step() has already been called for this optimizer "
                               "since the last update().")
        self.unscale_(optimizer)
        if self.dynamic and self.isfinite is None:
            self.isfinite = self._global_norm() < float("inf")
            if self._max_gradient_norm:
                self._clip_to_max_gradient_norm()
        out = self.step_if_finite(optimizer, *args, **kwargs)
        self._stepped.add(id(optimizer))
        return out

    def _global_norm(self) -> torch.Tensor:
        if not self._squared_local_norms:
            raise RuntimeError(
                "GradScaler: no gradients were unscaled this step, so there is nothing to check "
                "for overflow; call scale(loss).backward() and then step(optimizer).")
        return torch.sqrt(torch.sum(torch.stack(self._squared_local_norms)))

    def _clip_to_max_gradient_norm(self) -> None:
        """Every unscaled optimizer's gradients scaled to the global norm
        ``max_gradient_norm`` at most."""
        clip_coef = float(self._max_gradient_norm) / (self._global_norm() + 1e-6)
        clip_coef = torch.clamp(clip_coef, max=1.0)
        grads = [p.grad for opt in self._unscaled.values() for p in _params(opt)
                 if p.grad is not None]
        for group, _ in group_tensors(grads):
            foreach.mul_(group, clip_coef)

    @torch.no_grad()
    def step_if_finite(self, optimizer, *args, **kwargs):
        """``optimizer.step()``, its effect on parameters and state kept only where this step's
        gradients were finite (static scaling: always)."""
        if not self.dynamic:
            return optimizer.step(*args, **kwargs)
        if self.isfinite is None:
            raise RuntimeError("GradScaler.step_if_finite: the overflow check has not run; call "
                               "GradScaler.step(optimizer).")
        self._num_skipped_steps.add_(1 - self.isfinite.long())
        optimizer.ensure_preinitialized()
        tensors = _params(optimizer)
        tensors += [t for s in optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor)]
        saved = _copies(tensors)
        marked: list = []  # update_if_finite's (tensor, copy) pairs
        _CONDITIONAL_STEPS[optimizer] = (self.isfinite, marked)
        try:
            out = optimizer.step(*args, **kwargs)
        finally:
            del _CONDITIONAL_STEPS[optimizer]
        for t, old in [*zip(tensors, saved), *marked]:
            t.copy_(torch.where(self.isfinite, t, old))
        return out

    @torch.no_grad()
    def update(self, new_scale=None) -> None:
        """Update the scale once every optimizer has stepped (dynamic scaling)."""
        if new_scale:
            raise ValueError("cstream.amp.GradScaler does not take a new_scale: the scale is "
                             "updated by its own rule (or fixed, with a static loss_scale).")
        if self.dynamic:
            if self.isfinite is None:
                raise RuntimeError("GradScaler.update() before step(): the scale is updated "
                                   "from the step's overflow check; call step(optimizer) first.")
            self._update_scale()
        self._squared_local_norms = []
        self.isfinite = None
        self._unscaled.clear()
        self._stepped.clear()

    def _update_scale(self) -> None:
        steps, overflows, scale = (self._steps_since_rescale, self._overflows_since_rescale,
                                   self._loss_scale)
        steps.add_(1)
        overflows.add_(1 - self.isfinite.long())
        ratio = overflows.float() / steps.float()
        decrease = (self._overflow_tolerance < ratio).long()
        scale.div_((1 + decrease).float())
        overflows.mul_(1 - decrease)
        steps.mul_(1 - decrease)
        # after the decrease, on purpose: its reset may have restarted the counters
        increase = (self._steps_per_increase < steps).long()
        scale.mul_((1 + increase).float())
        overflows.mul_(1 - increase)
        steps.mul_(1 - increase)
        # clamp: torch.where with a number would put a constant tensor in the traced graph
        scale.clamp_(max=self._max_loss_scale)
        self._non_clamped_loss_scale = scale.detach().clone()
        scale.clamp_(min=self._min_loss_scale)


def update_if_finite(optimizer, tensor: torch.Tensor) -> None:
    """Inside ``optimizer.step()`` run by a dynamic :class:`GradScaler`: keep ``tensor``'s value
    from now on only if the step's gradients are finite (its parameters and ``state`` are kept
    that way already). Elsewhere it does nothing."""
    active = _CONDITIONAL_STEPS.get(optimizer)
    if active is not None:
        active[1].append((tensor, tensor.clone()))


def isfinite(optimizer):
    """Inside ``optimizer.step()`` run by a dynamic :class:`GradScaler`: whether this step's
    gradients are finite (a bool tensor); True elsewhere."""
    active = _CONDITIONAL_STEPS.get(optimizer)
    return True if active is None else active[0]


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _optimizers(optimizer) -> list:
    from cstream.optim.optimizer import Optimizer

    if isinstance(optimizer, Optimizer):
        return [optimizer]
    if isinstance(optimizer, (list, tuple)):
        for i, opt in enumerate(optimizer):
            if not isinstance(opt, Optimizer):
                raise TypeError(f"optimizer_step: optimizer {i} should be a "
                                f"cstream.optim.Optimizer, got {type(opt).__name__}.")
        return list(optimizer)
    raise TypeError(f"optimizer_step: optimizer should be a cstream.optim.Optimizer or a list of "
                    f"them, got {type(optimizer).__name__}.")


def optimizer_step(loss: torch.Tensor, optimizer, grad_scaler: Optional[GradScaler] = None,
                   max_gradient_norm: Optional[float] = None,
                   max_gradient_value: Optional[float] = None,
                   max_gradient_val: Optional[float] = None) -> None:
    """backward (scaled with a scaler), unscale, clip (by norm or by value), step, update,
    zero_grad. ``optimizer`` may be a list of optimizers; ``grad_scaler`` None runs without
    loss scaling; ``max_gradient_val`` is the spelling of Cerebras' porting guide for
    ``max_gradient_value``."""
    if not isinstance(loss, torch.Tensor):
        raise ValueError(f"optimizer_step: loss should be a single tensor, got "
                         f"{type(loss).__name__}.")
    if max_gradient_val is not None:
        if max_gradient_value is not None:
            raise ValueError("optimizer_step: give max_gradient_value or max_gradient_val (the "
                             "same argument), not both.")
        max_gradient_value = max_gradient_val
    optimizers = _optimizers(optimizer)
    if grad_scaler is not None and not isinstance(grad_scaler, GradScaler):
        raise TypeError(f"optimizer_step: grad_scaler should be a cstream.amp.GradScaler or "
                        f"None, got {type(grad_scaler).__name__}.")
    for name, value in (("max_gradient_norm", max_gradient_norm),
                        ("max_gradient_value", max_gradient_value)):
        if value is not None and value < 0.0:
            raise ValueError(f"optimizer_step: {name} has to be a non-negative float, got "
                             f"{value}.")
    if max_gradient_norm is not None and max_gradient_value is not None:
        raise ValueError(
            f"optimizer_step: gradients can be clipped by norm (={max_gradient_norm}) or by "
            f"value (={max_gradient_value}), not both; give max_gradient_norm or "
            "max_gradient_value.")
    if grad_scaler is not None:
        grad_scaler.scale(loss).backward()
        for opt in optimizers:
            grad_scaler.unscale_(opt)
    else:
        loss.backward()
    params = [p for opt in optimizers for p in _params(opt)]
    if max_gradient_norm is not None:
        clip_grad_norm_(params, float(max_gradient_norm))
    elif max_gradient_value is not None:
        clip_grad_value_(params, float(max_gradient_value))
    for opt in optimizers:
        if grad_scaler is not None:
            grad_scaler.step(opt)
        else:
            opt.step()
    if grad_scaler is not None:
        grad_scaler.update()
    for opt in optimizers:
        opt.zero_grad()


def _grads_by_device_and_dtype(params) -> list[list[torch.Tensor]]:
    return [group for group, _ in group_tensors([p.grad for p in params if p.grad is not None])]


def clip_grad_norm_(params, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s rule (its multi-tensor path, on every device): the
    gradients scaled by ``min(1, max_norm / (total_norm + 1e-6))``; returns the total norm.

    One multi-tensor (``foreach``) op per stage, so a traced step gets a few ops for the whole model.
    """
    groups = _grads_by_device_and_dtype(params)
    if not groups:
        return torch.tensor(0.0)
    first = groups[0][0].device
    norms = [n for grads in groups for n in foreach.norm(grads, norm_type)]
    total = torch.linalg.vector_norm(torch.stack([_on(n, first) for n in norms]), norm_type)
    clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grads in groups:
        foreach.mul_(grads, _on(clip_coef, grads[0].device))
    return total


def _copies(tensors: list) -> list:
    """Exact copies of ``tensors``: floating-point ones with one ``x * 1`` op per dtype."""
    out = [None] * len(tensors)
    for group, indices in group_tensors(tensors):
        copies = foreach.mul(group, 1) if group[0].dtype.is_floating_point else [
            t.clone() for t in group]
        for i, c in zip(indices, copies):
            out[i] = c
    return out


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # no copy (and no device transfer in a traced step) when it is already there
    return t if t.device == device else t.to(device)


def clip_grad_value_(params, clip_value: float) -> None:
    """``torch.nn.utils.clip_grad_value_``'s rule, one multi-tensor (``foreach``) op per stage."""
    for grads in _grads_by_device_and_dtype(params):
        foreach.clamp_min_(grads, -clip_value)
        foreach.clamp_max_(grads, clip_value)
