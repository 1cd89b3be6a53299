"""GradScaler and optimizer_step: loss scaling with the overflow check done by tensor ops."""

from __future__ import annotations

from typing import Optional, Union

import torch

import cstream
from cstream.optim.optimizer import group_tensors


class GradScaler:
    """Static (``loss_scale`` a number) or dynamic (``loss_scale="dynamic"``) loss scaling.

    Dynamic scaling halves the scale when a step's gradients hold inf/NaN (that step's update is
    skipped: parameters and optimizer state keep their values) and doubles it after
    ``steps_per_increase`` clean steps, within ``[min_loss_scale, max_loss_scale]``. All of it is
    tensor ops, so it traces into the step's graph.
    """

    def __init__(self, loss_scale: Union[str, float] = 0.0, init_scale: Optional[float] = None,
                 steps_per_increase: Optional[int] = None, min_loss_scale: Optional[float] = None,
                 max_loss_scale: Optional[float] = None, overflow_tolerance: float = 0.05,
                 max_gradient_norm: Optional[float] = None):
        if loss_scale == "dynamic":
            self.dynamic = True
            scale = 2.0 ** 15 if init_scale is None else float(init_scale)
        elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
            self.dynamic = False
            scale = float(loss_scale) if loss_scale else 1.0
        else:
            raise ValueError(
                f"GradScaler: loss_scale must be a number (static scaling) or 'dynamic', got "
                f"{loss_scale!r}.")
        self.steps_per_increase = 2000 if steps_per_increase is None else int(steps_per_increase)
        self.min_loss_scale = 2.0 ** -14 if min_loss_scale is None else float(min_loss_scale)
        self.max_loss_scale = 2.0 ** 24 if max_loss_scale is None else float(max_loss_scale)
        if self.min_loss_scale > self.max_loss_scale:
            raise ValueError(f"GradScaler: min_loss_scale {self.min_loss_scale} is larger than "
                             f"max_loss_scale {self.max_loss_scale}.")
        self.overflow_tolerance = float(overflow_tolerance)
        self.max_gradient_norm = max_gradient_norm
        self._scale = cstream.full((), scale, dtype=torch.float32)
        self._clean_steps = cstream.zeros((), dtype=torch.float32)
        self._found_inf = cstream.zeros((), dtype=torch.float32)
        self._unscaled: set = set()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale.to(loss.dtype)

    @torch.no_grad()
    def unscale_(self, optimizer) -> None:
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() was already called on this optimizer since the last "
                               "update().")
        inv = 1.0 / self._scale
        found = torch.zeros_like(self._found_inf)  # an op of the step, not a constant of it
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for grads in _grads_by_device_and_dtype(params):
            # torch.amp's own kernel: flags a non-finite gradient, multiplies by 1/scale
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        self._found_inf.copy_(found)
        self._unscaled.add(id(optimizer))

    @torch.no_grad()
    def step(self, optimizer, *args, **kwargs):
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        optimizer._ensure_preinitialized()
        tensors = [p for g in optimizer.param_groups for p in g["params"]]
        tensors += [t for s in optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor)]
        saved = _copies(tensors)
        out = optimizer.step(*args, **kwargs)
        # a step with inf/NaN gradients is skipped: every tensor it changed gets its old value
        # back (whatever inf/NaN the update computed is dropped with it)
        skip = self._found_inf > 0
        for t, old in zip(tensors, saved):
            torch.where(skip, old, t, out=t)
        return out

    @torch.no_grad()
    def update(self, new_scale=None) -> None:
        self._unscaled.clear()
        if new_scale is not None:
            self._scale.fill_(float(new_scale))
            return
        if not self.dynamic:
            return
        overflow = self._found_inf > 0
        clean = torch.where(overflow, torch.zeros_like(self._clean_steps), self._clean_steps + 1)
        grow = clean >= self.steps_per_increase
        scale = torch.where(overflow, self._scale * 0.5,
                            torch.where(grow, self._scale * 2.0, self._scale))
        self._scale.copy_(torch.clamp(scale, self.min_loss_scale, self.max_loss_scale))
        self._clean_steps.copy_(torch.where(grow, torch.zeros_like(clean), clean))
        self._found_inf.zero_()

    def get_scale(self) -> float:
        """The current scale as a float (reads a value: call it outside the traced step)."""
        return float(self._scale)

    def state_dict(self) -> dict:
        return {"scale": self._scale, "clean_steps": self._clean_steps, "dynamic": self.dynamic,
                "steps_per_increase": self.steps_per_increase,
                "min_loss_scale": self.min_loss_scale, "max_loss_scale": self.max_loss_scale}

    def load_state_dict(self, state_dict: dict) -> None:
        with torch.no_grad():
            self._scale.copy_(torch.as_tensor(state_dict["scale"], dtype=torch.float32))
            self._clean_steps.copy_(torch.as_tensor(state_dict["clean_steps"],
                                                    dtype=torch.float32))


def optimizer_step(loss: torch.Tensor, optimizer, grad_scaler: Optional[GradScaler] = None,
                   max_gradient_norm: Optional[float] = None,
                   max_gradient_val: Optional[float] = None) -> None:
    """backward (scaled with a scaler), unscale, clip (by norm or by value), step, update,
    zero_grad -- the common path of seed 000."""
    if max_gradient_norm is not None and max_gradient_val is not None:
        raise ValueError(
            "optimizer_step: give max_gradient_norm or max_gradient_val, not both (got "
            f"{max_gradient_norm!r} and {max_gradient_val!r}).")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if grad_scaler is not None:
        grad_scaler.scale(loss).backward()
        grad_scaler.unscale_(optimizer)
    else:
        loss.backward()
    if max_gradient_norm is not None:
        clip_grad_norm_(params, float(max_gradient_norm))
    elif max_gradient_val is not None:
        clip_grad_value_(params, float(max_gradient_val))
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad()


def _grads_by_device_and_dtype(params) -> list[list[torch.Tensor]]:
    return [group for group, _ in group_tensors([p.grad for p in params if p.grad is not None])]


def clip_grad_norm_(params, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s rule (its multi-tensor path, on every device): the
    gradients scaled by ``min(1, max_norm / (total_norm + 1e-6))``; returns the total norm.

    One ``torch._foreach_*`` op per stage, so a traced step gets a few ops for the whole model.
    """
    groups = _grads_by_device_and_dtype(params)
    if not groups:
        return torch.tensor(0.0)
    first = groups[0][0].device
    norms = [n for grads in groups for n in torch._foreach_norm(grads, norm_type)]
    total = torch.linalg.vector_norm(torch.stack([_on(n, first) for n in norms]), norm_type)
    clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grads in groups:
        torch._foreach_mul_(grads, _on(clip_coef, grads[0].device))
    return total


def _copies(tensors: list) -> list:
    """Exact copies of ``tensors``: floating-point ones with one ``x * 1`` op per dtype."""
    out = [None] * len(tensors)
    for group, indices in group_tensors(tensors):
        copies = torch._foreach_mul(group, 1) if group[0].dtype.is_floating_point else [
            t.clone() for t in group]
        for i, c in zip(indices, copies):
            out[i] = c
    return out


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # no copy (and no device transfer in a traced step) when it is already there
    return t if t.device == device else t.to(device)


def clip_grad_value_(params, clip_value: float) -> None:
    """``torch.nn.utils.clip_grad_value_``'s rule, one ``torch._foreach_*`` op per stage."""
    for grads in _grads_by_device_and_dtype(params):
        torch._foreach_clamp_min_(grads, -clip_value)
        torch._foreach_clamp_max_(grads, clip_value)
