"""``cerebras.appliance.utils.debug_args`` (Release 2.3 on): the debug-args helpers of
:mod:`cstream.appliance.run_utils` under their newer module name."""

from __future__ import annotations

from typing import Union

from cstream.appliance.run_utils import DebugArgs, update_debug_args_from_keys, write_debug_args
from cstream.appliance.run_utils import get_debug_args as _read


def get_debug_args(value: Union[DebugArgs, str, None]) -> DebugArgs:
    """A DebugArgs given as one (returned as is), as a file path (read) or None (empty)."""
    if isinstance(value, DebugArgs):
        return value
    return _read(value)


__all__ = ["DebugArgs", "get_debug_args", "update_debug_args_from_keys", "write_debug_args"]
