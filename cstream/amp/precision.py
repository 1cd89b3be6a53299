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
alike, so that the CPU backend stays the oracle of every CSX run. One more case follows the real
CSX: a CSX backend created without ``mixed_precision`` whose step receives a float16 or bfloat16
tensor (a Model Zoo loader streams half inputs when ``use_cs()``) autocasts to that dtype, so
half inputs meet float32 weights as on the real system. ``mixed_precision=False`` turns that off.
"""

from __future__ import annotations

import contextlib

import torch

from workers.torch_compat import tree_leaves


def _half_input(inputs) -> torch.dtype | None:
    """The 16-bit floating dtype of the first such tensor among ``inputs`` (nested), or None."""
    for leaf in tree_leaves(inputs):
        if isinstance(leaf, torch.Tensor) and leaf.dtype in (torch.float16, torch.bfloat16):
            return leaf.dtype
    return None


def step_autocast(backend, inputs=()):
    """The autocast a step runs under on ``backend``: on when mixed precision is (the backend's
    ``mixed_precision`` option, else :func:`cstream.amp.mixed_precision`), with
    :func:`cstream.amp.get_half_dtype`; on a CSX backend given no ``mixed_precision``, also when
    the step's ``inputs`` hold a half tensor (with that tensor's dtype)."""
    from cstream import amp

    device = backend.device.torch_device.type
    on = backend.mixed_precision if backend.mixed_precision is not None else \
        amp.mixed_precision()
    if on:
        return torch.autocast(device_type=device, dtype=amp.get_half_dtype())
    half = _half_input(inputs) if backend.is_csx and backend.mixed_precision is None else None
    if half is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=half)
