"""``cstream.amp``: loss scaling and mixed precision that trace into the static graph.

The half dtype and the mixed-precision switch follow ``cerebras.pytorch.amp``:
``set_half_dtype("bfloat16")`` (or a torch dtype) also turns mixed precision on;
``get_floating_point_dtype()`` is the half dtype while it is on, float32 otherwise. cstream has
no ``cbfloat16`` tensors: that name stands for float16, as the real package's proxy dtype does.

Both settings reach the input workers as the Cerebras stack sends them, in the environment
(``cerebras.appliance.environment.appliance_environ``): ``CEREBRAS_FP16_DTYPE`` (the half dtype's
name) and ``CEREBRAS_MIXED_PRECISION`` (``"1"`` / ``"0"``). Inside an input worker, and the
DataLoader worker processes it starts, :func:`get_half_dtype` and :func:`mixed_precision` read
them, so a data processor that casts to the half dtype sends what the client set; changing them
there is an error, as in the Cerebras package (the model was built with the client's).
"""

from __future__ import annotations

import contextlib
import os

import torch

from cstream.amp.grad_scaler import GradScaler, isfinite, optimizer_step, update_if_finite
from cstream.appliance.environment import appliance_environ
from workers.context import is_streamer

_HALF_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "cbfloat16": torch.float16}
_STATE = {"half": "float16", "enabled": False}
DTYPE_ENV_VAR = "CEREBRAS_FP16_DTYPE"
ENABLED_ENV_VAR = "CEREBRAS_MIXED_PRECISION"


def _set(half: str | None = None, enabled: bool | None = None, what: str = "") -> None:
    """Change the client's settings and the environment the input workers receive."""
    if is_streamer():
        raise RuntimeError(
            f"{what} in the dataloader is not allowed as it might conflict with what the model "
            "was compiled with. Set it outside of the dataloader, before constructing the model.")
    if half is not None:
        _STATE["half"] = half
        appliance_environ[DTYPE_ENV_VAR] = half
    if enabled is not None:
        _STATE["enabled"] = enabled
        appliance_environ[ENABLED_ENV_VAR] = str(int(enabled))


def _half() -> str:
    """The half dtype's name: the client's, or inside an input worker the one it sent."""
    if is_streamer():
        name = os.environ.get(DTYPE_ENV_VAR, _STATE["half"])
        return name if name in _HALF_DTYPES else _STATE["half"]
    return _STATE["half"]


def _enabled() -> bool:
    if is_streamer():
        return os.environ.get(ENABLED_ENV_VAR, str(int(_STATE["enabled"]))) == "1"
    return _STATE["enabled"]


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
    _set(half=name, enabled=True, what="Setting the half dtype")
    return get_half_dtype()


def get_half_dtype() -> torch.dtype:
    """The 16-bit dtype set by :func:`set_half_dtype` (float16 unless set)."""
    return _HALF_DTYPES[_half()]


def get_half_dtype_str() -> str:
    return _half()


def use_bfloat16(use: bool = True) -> None:
    """The switch of Cerebras' porting guide: bfloat16 (True) or float16 (False) as the half
    dtype of automatic mixed precision. It picks the dtype only; it does not turn mixed
    precision on (the backend's ``mixed_precision`` option, :func:`set_half_dtype` or
    :func:`enable_mixed_precision` do)."""
    if not isinstance(use, bool):
        raise TypeError(f"use_bfloat16 expects True or False, got {use!r}.")
    _set(half="bfloat16" if use else "float16", what="Setting the half dtype")


def enable_mixed_precision(enable: bool = True) -> bool:
    if not isinstance(enable, bool):
        raise ValueError(f"enable_mixed_precision expects a bool, got {type(enable).__name__}.")
    _set(enabled=enable, what="Enabling/disabling mixed precision")
    return enable


def mixed_precision() -> bool:
    """Whether mixed precision is on (``set_half_dtype`` turns it on)."""
    return _enabled()


def get_floating_point_dtype(default: torch.dtype = torch.float32) -> torch.dtype:
    return get_half_dtype() if _enabled() else default


def get_floating_point_dtype_str(default: str = "float32") -> str:
    return _half() if _enabled() else default


def is_cbfloat16_tensor(tensor: torch.Tensor) -> bool:
    return tensor.dtype == get_half_dtype() and _half() == "cbfloat16"


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
