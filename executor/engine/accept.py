"""What a step may do on the wafer that eager PyTorch on CPU refuses, made to work on every
backend alike (the CPU backend runs its steps under the same mode, so it stays the oracle).

* Class-index targets of any integer dtype: the real stack takes int32 labels (data pipelines
  make them); torch's CPU kernels of ``nll_loss``/``cross_entropy`` and ``one_hot`` want int64.
  Integer targets are widened to int64 where torch needs it, which changes no value.

The mode sees every torch call of the step in Python. A traced step pays that once; an eager
step pays it on every op of every step (it doubles a small step's time), so an eager backend
enters it only for a step whose inputs hold a narrow integer tensor
(:func:`needs_accept_mode`): the labels a data pipeline made.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_NARROW_INTS = (torch.int32, torch.int16, torch.int8, torch.uint8)


def _widened(t):
    if isinstance(t, torch.Tensor) and t.dtype in _NARROW_INTS:
        return t.long()
    return t


def _widen_arg(args, kwargs, position: int, name: str):
    if name in kwargs:
        kwargs = {**kwargs, name: _widened(kwargs[name])}
    elif len(args) > position:
        args = (*args[:position], _widened(args[position]), *args[position + 1:])
    return args, kwargs


# function -> (position, name) of its class-index argument
_INDEX_ARGS = {
    F.cross_entropy: (1, "target"),
    F.nll_loss: (1, "target"),
    F.one_hot: (0, "tensor"),
}


def needs_accept_mode(tree) -> bool:
    """Whether ``tree`` (a step's ``(args, kwargs)``) holds a narrow integer tensor, which
    :class:`AcceptMode` widens where torch needs it."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.dtype in _NARROW_INTS:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


class AcceptMode(TorchFunctionMode):
    """Active while a step runs or is traced: see the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = _INDEX_ARGS.get(func)
        if index is not None:
            args, kwargs = _widen_arg(args, kwargs, *index)
        return func(*args, **kwargs)
