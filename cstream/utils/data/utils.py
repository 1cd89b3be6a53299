"""Step counts and numpy conversions of the Cerebras data utilities.

>>> compute_num_steps(list(range(10)), num_epochs=2, grad_accum_steps=2)
10
>>> compute_num_steps(list(range(10)), initial_step=4, max_steps=6)
2
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch


def _check_steps(name, value, allow_none=False, allow_zero=False):
    if value is None:
        if not allow_none:
            raise ValueError(f"`{name}` cannot be None.")
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be an integer, but got {type(value)}.")
    if value == 0 and not allow_zero:
        raise ValueError(f"`{name}` must be greater than zero.")
    if value < 0:
        raise ValueError(f"`{name}` cannot be negative, but got {value}.")


def _steps_per_epoch(dataloader, steps_per_epoch, grad_accum_steps, num_epochs):
    try:
        size = len(dataloader)
    except TypeError:
        if num_epochs is not None:
            raise ValueError(
                "Specifying num_epochs for datasets with unknown length is not allowed. Please "
                "control training behavior through number of steps instead.") from None
        return 1
    if size <= 0:
        raise ValueError("Dataloader does not generate any batches.")
    if steps_per_epoch is not None and steps_per_epoch > size:
        raise ValueError(f"The requested steps per epoch of {steps_per_epoch} exceeds total "
                         f"steps in an epoch, which is {size}.")
    steps_per_epoch = size if steps_per_epoch is None else steps_per_epoch
    if grad_accum_steps > steps_per_epoch:
        raise ValueError(f"Gradient accumulation steps of {grad_accum_steps} is greater than "
                         f"batches per epoch of {steps_per_epoch}.")
    return steps_per_epoch // grad_accum_steps


def compute_num_steps(dataloader, initial_step: int = 0, num_steps: Optional[int] = None,
                      max_steps: Optional[int] = None, num_epochs: Optional[int] = None,
                      steps_per_epoch: Optional[int] = None, grad_accum_steps: int = 1) -> int:
    """The steps to run: the least of ``num_epochs`` epochs (of ``steps_per_epoch`` or the
    dataloader's length, over ``grad_accum_steps``), ``num_steps`` and ``max_steps -
    initial_step``. At least one of ``num_steps``, ``max_steps``, ``num_epochs`` is needed."""
    if num_epochs is not None and num_steps is not None:
        raise ValueError("Only one of `num_epochs` or `num_steps` can be specified.")
    _check_steps("initial_step", initial_step, allow_zero=True)
    for name, v in (("num_steps", num_steps), ("max_steps", max_steps),
                    ("num_epochs", num_epochs), ("steps_per_epoch", steps_per_epoch)):
        _check_steps(name, v, allow_none=True)
    _check_steps("grad_accum_steps", grad_accum_steps)
    per_epoch = _steps_per_epoch(dataloader, steps_per_epoch, grad_accum_steps, num_epochs)
    total = math.inf
    if num_epochs is not None:
        total = min(total, num_epochs * per_epoch)
    if num_steps is not None:
        total = min(total, num_steps)
    if max_steps is not None:
        remaining = max_steps - initial_step
        if remaining <= 0:
            raise RuntimeError(f"Initial global step {initial_step} already exceeds max step "
                               f"{max_steps}.")
        total = min(total, remaining)
    if math.isinf(total):
        raise ValueError("One of num_epochs, num_steps, or max_steps must be provided")
    return total


def to_numpy(tensor) -> np.ndarray:
    """A tensor as a numpy array (an array is returned as is). bfloat16, which numpy lacks, is
    converted to float32."""
    if isinstance(tensor, np.ndarray):
        return tensor
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def from_numpy(array) -> torch.Tensor:
    """A numpy array as a tensor (a tensor is returned as is; a read-only array is copied)."""
    if isinstance(array, torch.Tensor):
        return array
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)
