"""``cstream.amp``: loss scaling and mixed precision that trace into the static graph.

The half dtype and the mixed-precision switch follow ``cerebras.pytorch.amp``:
``set_half_dtype("bfloat16")`` (or a torch dtype) also turns mixed precision on;
``get_floating_point_dtype()`` is the half dtype while it is on, float32 otherwise. What mixed
precision does to a step: :mod:`cstream.amp.precision`.
"""

from __future__ import annotations

import torch

from cstream.amp.grad_scaler import GradScaler, optimizer_step

_HALF_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_STATE = {"half": "float16", "enabled": False}


def set_half_dtype(value) -> torch.dtype:
    """Use ``value`` (``torch.float16``, ``torch.bfloat16``, "float16" or "bfloat16") as the
    16-bit dtype and turn mixed precision on; returns the torch dtype."""
    if value == torch.float16:
        name = "float16"
    elif value == torch.bfloat16:
        name = "bfloat16"
    elif isinstance(value, str) and value in _HALF_DTYPES:
        name = value
    else:
        raise ValueError(f"Invalid half dtype: {value!r}. Accepted values are \"float16\", "
                         f"\"bfloat16\", {torch.float16} and {torch.bfloat16}.")
    _STATE["half"], _STATE["enabled"] = name, True
    return get_half_dtype()


def use_bfloat16(use: bool = True) -> None:
    """Seed 000's switch: bfloat16 (True) or float16 (False) as the half dtype of automatic
    mixed precision (it does not turn mixed precision on)."""
    _STATE["half"] = "bfloat16" if use else "float16"


def get_half_dtype() -> torch.dtype:
    """The 16-bit dtype (float16 unless set)."""
    return _HALF_DTYPES[_STATE["half"]]


def get_half_dtype_str() -> str:
    return _STATE["half"]


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


def autocast(dtype: torch.dtype = None, enabled: bool = True, device_type: str = "cpu"):
    """``torch.autocast`` with ``dtype`` (default: the half dtype); inside a traced step it is
    traced like any op, so CSX and CPU compute the same numbers."""
    return torch.autocast(device_type=device_type, dtype=dtype or get_half_dtype(),
                          enabled=enabled)


__all__ = ["GradScaler", "autocast", "enable_mixed_precision", "get_floating_point_dtype",
           "get_half_dtype", "get_half_dtype_str", "mixed_precision", "optimizer_step",
           "set_half_dtype", "use_bfloat16"]
