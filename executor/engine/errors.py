"""Errors of the tracing engine."""


class TracingError(RuntimeError):
    """A traced step did something that cannot be captured into a static graph."""


class CompileError(RuntimeError):
    """The captured graph cannot be compiled, or it changed between iterations."""
