"""``cstream.amp``: loss scaling and mixed precision that trace into the static graph.

The half dtype and the mixed-precision switch follow ``cerebras.pytorch.amp``:
``set_half_dtype("bfloat16")`` (or a torch dtype) also turns mixed precision on;
``get_floating_point_dtype()`` is the half dtype while it is on, float32 otherwise. cstream has
no ``cbfloat16`` tensors: that name stands for float16, as the real package's proxy dtype does.
"""

from __future__ import annotations

import contextlib

import torch

from cstream.amp.grad_scaler import GradScaler, isfinite, optimizer_step, update_if_finite

_HALF_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "cbfloat16": torch.float16}
_STATE = {"half": "float16", "enabled": False}


def set_half_dtype(value) -> torch.dtype:
    """Use ``value`` (``torch.float16``, ``torch.bfloat16`` or one of "float16", "bfloat16",
    "cbfloat16") as the 16-bit dtype and turn mixed precision on; returns the torch dtype
    models use for it."""
    if value == torch.float16:
        name = "float16"
    elif value == torch.bfloat16:
        name = "bfloat16"
    elif isinstance(value, str) and value in _HALF_DTYPES:
        name = value
    else:
        raise ValueError(f"Invalid half dtype: {value!r}. Accepted values are: \"float16\", "
                         f"\"bfloat16\", \"cbfloat16\", {torch.float16}, {torch.bfloat16}.")
    _STATE["half"] = name
    _STATE["enabled"] = True
    return get_half_dtype()


def get_half_dtype() -> torch.dtype:
    """The 16-bit dtype set by :func:`set_half_dtype` (float16 unless set)."""
    return _HALF_DTYPES[_STATE["half"]]


def get_half_dtype_str() -> str:
    return _STATE["half"]


def use_bfloat16(use: bool = True) -> None:
    """The switch of Cerebras' porting guide: bfloat16 (True) or float16 (False) as the half
    dtype of automatic mixed precision. It picks the dtype only; it does not turn mixed
    precision on (the backend's ``mixed_precision`` option, :func:`set_half_dtype` or
    :func:`enable_mixed_precision` do)."""
    if not isinstance(use, bool):
        raise TypeError(f"use_bfloat16 expects True or False, got {use!r}.")
    _STATE["half"] = "bfloat16" if use else "float16"


def enable_mixed_precision(enable: bool = True) -> bool:
    if not isinstance(enable, bool):
        raise ValueError(f"enable_mixed_precision expects a bool, got {type(enable).__name__}.")
    _STATE["enabled"] = enable
    return enable


def mixed_precision() -> bool:
    """Whether mixed precision is on (``set_half_dtype`` turns it on)."""
    return _STATE["enabled"]


def get_floating_point_dtype(default: torch.dtype = torch.float32) -> torch.dtype:
    return get_half_dtype() if _STATE["enabled"] else default


def get_floating_point_dtype_str(default: str = "float32") -> str:
    return _STATE["half"] if _STATE["enabled"] else default


def is_cbfloat16_tensor(tensor: torch.Tensor) -> bool:
    return tensor.dtype == get_half_dtype() and _STATE["half"] == "cbfloat16"


def autocast(dtype: torch.dtype = None, enabled: bool = True, device_type: str = "cpu"):
    """``torch.autocast`` with ``dtype`` (default: the half dtype)."""
    return torch.autocast(device_type=device_type, dtype=dtype or get_half_dtype(),
                          enabled=enabled)


@contextlib.contextmanager
def disable_casts():
    """Runs its block without autocast's casts."""
    with torch.autocast(device_type="cpu", enabled=False):
        yield


__all__ = ["GradScaler", "autocast", "disable_casts", "enable_mixed_precision",
           "get_floating_point_dtype", "get_floating_point_dtype_str", "get_half_dtype",
           "get_half_dtype_str", "is_cbfloat16_tensor", "isfinite", "mixed_precision",
           "optimizer_step", "set_half_dtype", "update_if_finite", "use_bfloat16"]
