"""Automatic mixed precision: which 16-bit dtype, whether it is on, and the autocast of steps.

Mixed precision is on for a step when the backend was created with ``mixed_precision=True``, or
(the backend given no ``mixed_precision``) after :func:`set_half_dtype` or
:func:`enable_mixed_precision`. A step with mixed precision on runs under
``torch.autocast(device, dtype=get_half_dtype())`` on every backend: the CPU backend runs it
eagerly, the CSX backend traces it, so the casts autocast inserts are ops of the wafer's graph
and both backends compute the same numbers. Which ops run in the half dtype is torch's CPU
autocast policy (``torch.autocast`` documentation, "CPU Ops that can autocast to bfloat16"; the
same list for float16): matrix products, convolutions and attention (``linear``, ``matmul``,
``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``conv1d/2d/3d``, ``conv_transpose*``,
``scaled_dot_product_attention``) cast their inputs to it; the losses (``cross_entropy``,
``nll_loss``, ``mse_loss``, ...) compute in float32; every other op (``layer_norm``,
``softmax``, ``gelu``, additions) runs in the dtype of its inputs, so a half activation stays
half and meets a float32 tensor by type promotion. So float16/bfloat16 inputs feed float32
weights, as on the real CSX.

The real CSX always autocasts; cstream autocasts when mixed precision is on, on CSX and CPU
alike, so that the CPU backend stays the oracle of every CSX run.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Union

import torch

_HALF_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class _Precision:
    enabled = False
    half_dtype = torch.float16


_state = _Precision()


def _half(value: Union[str, torch.dtype], what: str) -> torch.dtype:
    if isinstance(value, str) and value in _HALF_NAMES:
        return _HALF_NAMES[value]
    if value in (torch.float16, torch.bfloat16):
        return value
    raise ValueError(
        f"{what}: invalid half dtype {value!r}. Accepted values are \"float16\", \"bfloat16\", "
        f"{torch.float16} and {torch.bfloat16}."
    )


def set_half_dtype(value: Union[str, torch.dtype]) -> torch.dtype:
    """Set the 16-bit floating point dtype of mixed precision, and turn mixed precision on.

    Returns the dtype (``torch.float16`` or ``torch.bfloat16``)."""
    _state.half_dtype = _half(value, "cstream.amp.set_half_dtype")
    _state.enabled = True
    return _state.half_dtype


def use_bfloat16(use: bool = True) -> None:
    """Make automatic mixed precision use bfloat16 (``use=False``: float16, the default)."""
    _state.half_dtype = torch.bfloat16 if use else torch.float16


def get_half_dtype() -> torch.dtype:
    """The 16-bit dtype of mixed precision (float16 unless set otherwise)."""
    return _state.half_dtype


def get_half_dtype_str() -> str:
    return str(_state.half_dtype).split(".")[-1]


def enable_mixed_precision(enable: bool = True) -> bool:
    """Turn mixed precision on (or off) for steps on backends created without
    ``mixed_precision``; returns the new setting."""
    if not isinstance(enable, bool):
        raise ValueError(f"cstream.amp.enable_mixed_precision: expected a bool, got {enable!r}.")
    _state.enabled = enable
    return enable


def mixed_precision() -> bool:
    """Whether mixed precision is on (set_half_dtype / enable_mixed_precision)."""
    return _state.enabled


def get_floating_point_dtype(default: torch.dtype = torch.float32) -> torch.dtype:
    """The half dtype when mixed precision is on, else ``default``."""
    return _state.half_dtype if _state.enabled else default


def _device_type() -> str:
    from executor import runtime

    backend = runtime.current_backend()
    return backend.device.torch_device.type if backend is not None else "cpu"


def autocast(dtype: Optional[torch.dtype] = None, enabled: bool = True,
             device_type: Optional[str] = None):
    """``torch.autocast`` on the backend's device with ``dtype`` (default: the half dtype).

    Inside a traced step it is traced like any op, so CSX and CPU compute the same numbers."""
    if isinstance(dtype, bool):  # the older spelling autocast(enabled)
        dtype, enabled = None, dtype
    return torch.autocast(device_type=device_type or _device_type(),
                          dtype=_half(dtype, "cstream.amp.autocast") if dtype else
                          _state.half_dtype, enabled=enabled)


def step_autocast(backend):
    """The autocast a step runs under on ``backend``: on when mixed precision is (the backend's
    ``mixed_precision`` option, else the global setting)."""
    on = backend.mixed_precision if backend.mixed_precision is not None else _state.enabled
    if not on:
        return contextlib.nullcontext()
    return torch.autocast(device_type=backend.device.torch_device.type,
                          dtype=_state.half_dtype)
