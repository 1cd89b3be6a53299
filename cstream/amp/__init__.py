"""``cstream.amp``: loss scaling and mixed precision that trace into the static graph."""

from __future__ import annotations

import torch

from cstream.amp.grad_scaler import GradScaler, optimizer_step

_HALF = {"dtype": torch.float16}


def use_bfloat16(use: bool = True) -> None:
    """Make automatic mixed precision use bfloat16 instead of float16."""
    _HALF["dtype"] = torch.bfloat16 if use else torch.float16


def get_half_dtype() -> torch.dtype:
    return _HALF["dtype"]


def autocast(enabled: bool = True, device_type: str = "cpu"):
    """``torch.autocast`` with cstream's half dtype (float16, or bfloat16 after use_bfloat16)."""
    return torch.autocast(device_type=device_type, dtype=_HALF["dtype"], enabled=enabled)


__all__ = ["GradScaler", "autocast", "get_half_dtype", "optimizer_step", "use_bfloat16"]
