"""``cstream.amp``: loss scaling and mixed precision that trace into the static graph."""

from __future__ import annotations

import torch

from cstream.amp.grad_scaler import GradScaler, optimizer_step

_HALF = {"dtype": torch.float16}


def use_bfloat16(use: bool = True) -> None:
    """Make automatic mixed precision use bfloat16 instead of float16."""
    _HALF["dtype"] = torch.bfloat16 if use else torch.float16


def set_half_dtype(value) -> torch.dtype:
    """Set the 16-bit dtype of mixed precision: ``"float16"``, ``"bfloat16"`` or the torch
    dtype; returns it. (``"cbfloat16"``, the CS-X's own format, is not simulated.)"""
    names = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    dtype = names.get(value, value) if isinstance(value, str) else value
    if dtype not in (torch.float16, torch.bfloat16):
        from cstream.unsupported import unsupported

        if value == "cbfloat16":
            unsupported("the cbfloat16 half dtype (cerebras.pytorch.amp.set_half_dtype)")()
        raise ValueError(f"set_half_dtype({value!r}): expected 'float16', 'bfloat16', "
                         "torch.float16 or torch.bfloat16.")
    _HALF["dtype"] = dtype
    return dtype


def get_half_dtype() -> torch.dtype:
    return _HALF["dtype"]


def autocast(enabled: bool = True, device_type: str = "cpu"):
    """``torch.autocast`` with cstream's half dtype (float16, or bfloat16 after use_bfloat16)."""
    return torch.autocast(device_type=device_type, dtype=_HALF["dtype"], enabled=enabled)


__all__ = ["GradScaler", "autocast", "get_half_dtype", "optimizer_step", "set_half_dtype",
           "use_bfloat16"]
