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


def add_hook(hooks: "OrderedDict[int, Callable]", hook: Callable, what: str) -> RemovableHandle:
    """Put ``hook`` into the registry ``hooks``; the handle's ``.remove()`` takes it out.
    ``what`` names the registering function and the hook's signature for the error."""
    if not callable(hook):
        raise TypeError(f"{what}: expected a callable hook, got {type(hook).__name__}.")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def register_after_tensor_to_cpu(hook: TensorToCpuHook) -> RemovableHandle:
    """Call ``hook(tensor, name)`` after each tensor is fetched from the wafer; ``.remove()``
    the returned handle to stop."""
    return add_hook(_AFTER_TENSOR_TO_CPU, hook, "register_after_tensor_to_cpu(hook(tensor, name))")


def after_tensor_to_cpu(tensor, name: str) -> None:
    for hook in list(_AFTER_TENSOR_TO_CPU.values()):
        hook(tensor, name)
