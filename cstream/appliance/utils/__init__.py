"""The appliance client's file and unit helpers that Cerebras programs use."""

from cstream.appliance.utils import file, units

__all__ = ["file", "units"]
