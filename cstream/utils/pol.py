"""Precision optimization level (POL) annotations: how aggressively the Cerebras compiler may
lower the precision of a block's ops. cstream computes in the dtypes the program uses, so the
annotation is accepted and without effect.

>>> pol(bwd_level=0)(abs)(-3)
3
"""

from __future__ import annotations

from typing import Optional


class _Annotation:
    def __call__(self, fn):
        return fn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def pol(level: Optional[int] = None, bwd_level: Optional[int] = None, enable_fwd: bool = True,
        enable_bwd: bool = True):
    """A decorator (or ``with`` block) that leaves the function unchanged."""
    for name, v in (("level", level), ("bwd_level", bwd_level)):
        if v is not None and v not in (0, 1, 2):
            raise ValueError(f"pol({name}={v!r}): a precision optimization level is 0, 1 or 2.")
    return _Annotation()


def current_pol() -> int:
    """The level in effect: 1, the Cerebras default (cstream applies none)."""
    return 1
