"""Serializer switches of the Cerebras checkpoint writer: process-wide booleans, each also a
context manager that sets it for a block.

``use_external_link(True)``: the Cerebras writer stores tensors loaded from another checkpoint
as HDF5 links to that file instead of copies. ``cache_deferred_tensors(False)``: it does not
keep tensors it read lazily in memory. Both change how much is written or held, not what a
checkpoint loads as: cstream's writer always writes every tensor's data and its reader reads on
demand, so both are recorded and without effect.

>>> with use_external_link(True):
...     bool(use_external_link)
True
>>> use_external_link.value
False
"""

from __future__ import annotations


class BooleanContext:
    """A boolean setting: ``.value``, ``bool(...)``, and ``with setting(v):`` for a block."""

    def __init__(self, value: bool):
        self.value = bool(value)
        self._saved: list[bool] = []

    def __call__(self, value: bool) -> "BooleanContext":
        if not isinstance(value, bool):
            raise TypeError(f"expected True or False, got {value!r}")
        self._pending = value
        return self

    def __enter__(self):
        self._saved.append(self.value)
        self.value = self._pending
        return self

    def __exit__(self, *exc):
        self.value = self._saved.pop()
        return False

    def __bool__(self) -> bool:
        return self.value

    def __repr__(self) -> str:
        return f"BooleanContext({self.value})"


use_external_link = BooleanContext(False)
cache_deferred_tensors = BooleanContext(True)
