"""``cerebras.appliance.utils.ini`` (Release 2.3 on): INI flags in debug args."""

from __future__ import annotations

from cstream.appliance.run_utils import DebugArgs, set_default_ini, set_ini


def clear_ini(debug_args: DebugArgs, *names: str) -> None:
    """Remove the INI flags ``names`` (all of them when none are named)."""
    flags = debug_args.ini._fields
    for name in names or list(flags):
        flags.pop(name, None)


__all__ = ["clear_ini", "set_default_ini", "set_ini"]
