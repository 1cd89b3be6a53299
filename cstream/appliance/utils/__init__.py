"""The appliance client's helpers that Cerebras programs use: files, units, classes, debug args
and INI flags."""

from cstream.appliance.utils import classes, debug_args, file, ini, units

__all__ = ["classes", "debug_args", "file", "ini", "units"]
