"""Kernel annotations (``cerebras.pytorch.utils.kernel``): a choice of Cerebras kernel for a
block, e.g. ``"FAST_ATTENTION"``. A kernel computes the block's values; which one does is a
performance choice of the Cerebras compiler, and cstream runs every block with PyTorch's ops.
The annotation is accepted and without effect: the annotated function runs unchanged.

>>> f = kernel_annotater("FAST_ATTENTION")(lambda x: x + 1)
>>> f(1)
2
"""

from __future__ import annotations

from typing import Optional


def kernel_annotater(kernel: Optional[str] = None):
    """A decorator that returns the function unchanged (see the module's docstring)."""
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel_annotater: kernel must be a string or None, got {kernel!r}.")
    return lambda fn: fn
