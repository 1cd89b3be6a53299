"""Debug names: the names tensors and modules carry in the compiled graph.

cstream's graph keeps the Python names of parameters and buffers; these functions record the
names a program gives, so that :func:`get_debug_name` returns them. They do not change what a
step computes.

>>> import torch
>>> m = torch.nn.Linear(2, 2)
>>> add_debug_name(m, "encoder")
>>> get_debug_name(m)
'encoder'
>>> with name_scope("block1"):
...     current_scope()
'block1'
"""

from __future__ import annotations

import contextlib
import weakref

_NAMES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SCOPE: list[str] = []


def add_debug_name(module, root_name: str | None = None) -> None:
    """Name ``module`` (and, by their attribute paths, its submodules) ``root_name``."""
    root = root_name or type(module).__name__.lower()
    _NAMES[module] = root
    if hasattr(module, "named_modules"):
        for name, sub in module.named_modules():
            if name:
                _NAMES[sub] = f"{root}.{name}"


def get_debug_name(obj) -> str:
    """The name given by :func:`add_debug_name` ("" when none)."""
    try:
        return _NAMES.get(obj, "")
    except TypeError:
        return ""


def set_debug_scope(name: str) -> None:
    """Set the scope names are recorded under (replacing the current one)."""
    _SCOPE[:] = [name] if name else []


def current_scope() -> str:
    return ".".join(_SCOPE)


@contextlib.contextmanager
def name_scope(name: str, raw: bool = False):
    """Record ops inside the block under the scope ``name`` (nested scopes join with ".")."""
    _SCOPE.append(name)
    try:
        yield
    finally:
        _SCOPE.pop()
