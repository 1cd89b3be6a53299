"""Step counts, batch sizes, the checkpoint Schedule and numpy conversions of the Cerebras data
utilities.

>>> compute_num_steps(list(range(10)), num_epochs=2, grad_accum_steps=2)
10
>>> compute_num_steps(list(range(10)), initial_step=4, max_steps=6)
2
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np
import torch

from executor.schedule import Schedule  # noqa: F401  (cerebras.pytorch.utils.data.utils.Schedule)


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


def infer_batch_size(data, batch_size: Optional[int] = None) -> Optional[int]:
    """The batch size of a batch: the size of dimension 0 that all its tensors share (a 0-d
    tensor counts as 1). Sizes that differ within the batch, or from ``batch_size`` (an earlier
    batch's), are an error on a CS-X (``cstream.use_cs()``), where every batch has one size, and
    a warning elsewhere; within a batch the answer is then None.

    >>> infer_batch_size({"x": torch.zeros(4, 3), "y": [torch.zeros(4)]})
    4
    """
    from cstream.backend import use_cs
    from cstream.utils.nest import visit_torch_tensors

    sizes = {1 if t.dim() == 0 else t.shape[0] for _, t in visit_torch_tensors(data)}
    if not sizes:
        raise RuntimeError(
            "We could not detect any torch tensors in the input data returned by the dataloader. "
            "We expect the dataloader to return a nested dict/list/tuple of tensors. If there are "
            "custom types that internally hold tensors, we are not currently able to detect them. "
            "Please ensure that the dataloader returns tensors in the expected format.")
    if len(sizes) > 1:
        if use_cs():
            raise RuntimeError(
                f"Only uniform batch sizes are supported in CS runs, but the dataloader returned "
                f"a batch with batch sizes {sizes}. ")
        warnings.warn(
            f"Detected non-uniform batch sizes within the same batch: {sizes}. While this is "
            f"allowed in non-CSX runs, it may throw off metrics such as rate profiling. The run "
            f"will proceed assuming no batch size.")
        return None
    (size,) = sizes
    if batch_size is not None and size != batch_size:
        if use_cs():
            raise RuntimeError(
                f"Only uniform batch sizes are supported in CS runs, but the dataloader returned "
                f"two different batches with batch sizes {batch_size} and {size}. Make sure to "
                f"set `drop_last=True` in the dataloader.")
        warnings.warn(
            f"Detected non-uniform batch sizes between batches ({batch_size} vs {size}). While "
            f"this is allowed in non-CSX runs, it may throw off metrics such as rate profiling. ")
    return size
