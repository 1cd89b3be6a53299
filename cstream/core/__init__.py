"""``cstream.core``: the run modes and debug names (``cerebras.pytorch.core``)."""

from cstream.core import annotation, compile, modes, name_scope

__all__ = ["annotation", "compile", "modes", "name_scope"]
