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

import torch


def step_autocast(backend):
    """The autocast a step runs under on ``backend``: on when mixed precision is (the backend's
    ``mixed_precision`` option, else :func:`cstream.amp.mixed_precision`), with
    :func:`cstream.amp.get_half_dtype`."""
    from cstream import amp

    on = backend.mixed_precision if backend.mixed_precision is not None else \
        amp.mixed_precision()
    if not on:
        return contextlib.nullcontext()
    return torch.autocast(device_type=backend.device.torch_device.type,
                          dtype=amp.get_half_dtype())
