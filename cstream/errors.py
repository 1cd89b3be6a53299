"""Errors users meet, most re-exported at the top level."""

from cstream._lazy import CheckpointError
from executor.engine.errors import CompileError, TracingError
from workers.errors import (
    AutoscaleError,
    InputWorkerError,
    UnshardedInputError,
    UnshardedInputWarning,
    WorkerCrashLoopError,
)
from workers.resume import ExhaustedIteratorError, ResumeError
from workers.stall import InputStallError

__all__ = ["AutoscaleError", "CheckpointError", "CompileError", "ExhaustedIteratorError",
           "InputStallError", "InputWorkerError", "ResumeError",
           "TracingError", "UnshardedInputError", "UnshardedInputWarning", "WorkerCrashLoopError"]
