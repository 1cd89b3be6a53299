"""Hooks called when a tensor arrives on the client from the wafer (a step closure's argument
on the CSX backend), with the tensor and its name: what the Model Zoo's profiler uses to time
when a step's outputs came back."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch
from torch.utils.hooks import RemovableHandle

TensorToCpuHook = Callable[[torch.Tensor, str], None]

_AFTER_TENSOR_TO_CPU: "OrderedDict[int, TensorToCpuHook]" = OrderedDict()


def register_after_tensor_to_cpu(hook: TensorToCpuHook) -> RemovableHandle:
    """Call ``hook(tensor, name)`` after each tensor is fetched from the wafer; ``.remove()``
    the returned handle to stop."""
    if not callable(hook):
        raise TypeError(f"register_after_tensor_to_cpu: expected a callable hook(tensor, name), "
                        f"got {type(hook).__name__}.")
    handle = RemovableHandle(_AFTER_TENSOR_TO_CPU)
    _AFTER_TENSOR_TO_CPU[handle.id] = hook
    return handle


def after_tensor_to_cpu(tensor, name: str) -> None:
    for hook in list(_AFTER_TENSOR_TO_CPU.values()):
        hook(tensor, name)
