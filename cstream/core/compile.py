"""Hooks around the step function (``cerebras.pytorch.core.compile``): called with no arguments
before and after the function decorated with ``cstream.trace`` runs, each time it runs (on the
CSX backend that is while it is traced).

>>> calls = []
>>> h = register_trace_fn_pre_hook(lambda: calls.append("pre"))
>>> run_pre_hooks(); h.remove(); run_pre_hooks(); calls
['pre']
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from torch.utils.hooks import RemovableHandle

from executor.tensor_hooks import add_hook

_PRE: "OrderedDict[int, Callable[[], None]]" = OrderedDict()
_POST: "OrderedDict[int, Callable[[], None]]" = OrderedDict()


def register_trace_fn_pre_hook(hook: Callable[[], None]) -> RemovableHandle:
    """Call ``hook()`` before each run of the step function; returns the handle to remove it."""
    return add_hook(_PRE, hook, "register_trace_fn_pre_hook(hook())")


def register_trace_fn_post_hook(hook: Callable[[], None]) -> RemovableHandle:
    """Call ``hook()`` after each run of the step function; returns the handle to remove it."""
    return add_hook(_POST, hook, "register_trace_fn_post_hook(hook())")


def run_pre_hooks() -> None:
    for hook in list(_PRE.values()):
        hook()


def run_post_hooks() -> None:
    for hook in list(_POST.values()):
        hook()
