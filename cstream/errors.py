"""Errors users meet, re-exported at the top level."""

from executor.engine.errors import CompileError, TracingError

__all__ = ["CompileError", "TracingError"]
