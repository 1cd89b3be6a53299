"""``cstream.amp``: loss scaling and mixed precision that trace into the static graph."""

from __future__ import annotations

from cstream.amp.grad_scaler import GradScaler, optimizer_step
from cstream.amp.precision import (autocast, enable_mixed_precision, get_floating_point_dtype,
                                   get_half_dtype, get_half_dtype_str, mixed_precision,
                                   set_half_dtype, use_bfloat16)

__all__ = ["GradScaler", "autocast", "enable_mixed_precision", "get_floating_point_dtype",
           "get_half_dtype", "get_half_dtype_str", "mixed_precision", "optimizer_step",
           "set_half_dtype", "use_bfloat16"]
