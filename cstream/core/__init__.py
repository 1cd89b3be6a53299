"""``cstream.core``: the run modes and debug names (``cerebras.pytorch.core``)."""

from cstream.core import modes, name_scope

__all__ = ["modes", "name_scope"]
