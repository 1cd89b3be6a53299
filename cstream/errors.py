"""Errors users meet, re-exported at the top level."""

from executor.engine.errors import CompileError, TracingError
from workers.errors import (
    InputWorkerError,
    UnshardedInputError,
    UnshardedInputWarning,
    WorkerCrashLoopError,
)
from workers.resume import ExhaustedIteratorError, ResumeError
from workers.stall import InputStallError

__all__ = ["CompileError", "ExhaustedIteratorError", "InputStallError", "InputWorkerError",
           "ResumeError",
           "TracingError", "UnshardedInputError", "UnshardedInputWarning", "WorkerCrashLoopError"]
