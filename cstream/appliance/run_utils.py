"""Debug args: the appliance's tuning knobs, recorded by cstream and otherwise without effect.

Cerebras programs build a ``DebugArgs`` message, set INI flags and memory limits in it, write it
to a file and pass it to ``CSConfig(debug_args=...)``. cstream has no compiler or cluster servers
to tune: :class:`DebugArgs` records every field set (read back with :meth:`DebugArgs.to_dict`),
``CSConfig`` keeps it, and the run's profile lists it under the settings accepted without effect.

>>> d = get_debug_args(None)
>>> d.debug_usr.worker_resource.memory_bytes = 2 << 30
>>> set_default_ini(d, ws_opt_speed=True)
>>> set_ini(d, ws_opt_speed=False)
>>> d.to_dict()
{'debug_usr': {'worker_resource': {'memory_bytes': 2147483648}}, 'ini': {'ws_opt_speed': False}}
"""

from __future__ import annotations

import json
import os


class DebugArgs:
    """A message of nested fields: reading a missing field gives an empty sub-message."""

    def __init__(self, fields: dict | None = None):
        object.__setattr__(self, "_fields", {})
        for key, value in (fields or {}).items():
            setattr(self, key, DebugArgs(value) if isinstance(value, dict) else value)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        fields = object.__getattribute__(self, "_fields")
        if name not in fields:
            fields[name] = DebugArgs()
        return fields[name]

    def __setattr__(self, name, value):
        self._fields[name] = value

    def to_dict(self) -> dict:
        """The fields set (empty sub-messages left out)."""
        out = {}
        for key, value in self._fields.items():
            if isinstance(value, DebugArgs):
                value = value.to_dict()
                if not value:
                    continue
            out[key] = value
        return out

    def MergeFrom(self, other: "DebugArgs") -> None:  # noqa: N802 - the protobuf message's name
        """Merge ``other`` into this message: its sub-messages recursively, its other fields
        overwriting these (protobuf's ``MergeFrom``)."""
        if not isinstance(other, DebugArgs):
            raise TypeError(f"Parameter to MergeFrom() must be instance of same class: expected "
                            f"DebugArgs got {type(other).__name__}.")
        for key, value in other._fields.items():
            if isinstance(value, DebugArgs):
                getattr(self, key).MergeFrom(value)
            else:
                self._fields[key] = value

    def CopyFrom(self, other: "DebugArgs") -> None:  # noqa: N802 - the protobuf message's name
        """Make this message a copy of ``other``."""
        self._fields.clear()
        self.MergeFrom(other)

    def __eq__(self, other):
        return isinstance(other, DebugArgs) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"DebugArgs({self.to_dict()!r})"


def get_debug_args(path: str | None = None) -> DebugArgs:
    """The debug args written to ``path`` by :func:`write_debug_args` (empty ones for None)."""
    if path is None:
        return DebugArgs()
    try:
        with open(path, encoding="utf-8") as f:
            return DebugArgs(json.load(f))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"debug_args_path {str(path)!r} does not exist. Write one with "
            "cerebras.appliance.run_utils.write_debug_args(debug_args, path), or leave "
            "runconfig.debug_args_path unset."
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"debug_args_path {str(path)!r} is not a debug args file written by cstream "
            f"(JSON; {e}). cstream reads the files that write_debug_args writes; a protobuf text "
            "file from the Cerebras appliance has no meaning here: leave debug_args_path unset."
        ) from None


def write_debug_args(debug_args: DebugArgs, path: str) -> None:
    """Write ``debug_args`` to ``path`` (JSON) for :func:`get_debug_args`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(debug_args.to_dict(), f, indent=1, sort_keys=True)


def set_ini(debug_args: DebugArgs, **kwargs) -> None:
    """Set INI flags (overwriting earlier values)."""
    for key, value in kwargs.items():
        setattr(debug_args.ini, key, value)


def set_default_ini(debug_args: DebugArgs, **kwargs) -> None:
    """Set INI flags that are not set yet."""
    ini = debug_args.ini
    for key, value in kwargs.items():
        if key not in ini._fields:
            setattr(ini, key, value)


def update_debug_args_from_keys(debug_args: DebugArgs, updates: dict) -> None:
    """Set fields from ``{"a.b.c": value}`` (dotted paths) or nested dicts."""
    if not isinstance(updates, dict):
        raise TypeError(
            f"debug args updates: expected a dict of field paths to values, got "
            f"{type(updates).__name__}."
        )
    for key, value in updates.items():
        *parents, leaf = str(key).split(".")
        msg = debug_args
        for part in parents:
            msg = getattr(msg, part)
        if isinstance(value, dict):
            update_debug_args_from_keys(getattr(msg, leaf), value)
        else:
            setattr(msg, leaf, value)
