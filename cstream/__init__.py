"""cstream: an open implementation of the Cerebras PyTorch API.

>>> import cstream as cstorch
>>> backend = cstorch.backend("CPU")
>>> backend.shutdown()
"""

from __future__ import annotations

import os as _os

# Ray binds loopback only when this is set before it is imported (see README, "Security").
_os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from cstream import amp, distributed, metrics, optim, utils  # noqa: E402
from cstream._compile import compile  # noqa: E402,A004
from cstream._trace import TracedStep, compile_step, trace  # noqa: E402
from cstream.backend import backend, current_backend  # noqa: E402
from cstream.closures import checkpoint_closure, current_executor, step_closure  # noqa: E402
from cstream.creation import full, full_like, ones, ones_like, zeros, zeros_like  # noqa: E402
from cstream.errors import (  # noqa: E402
    CompileError,
    ExhaustedIteratorError,
    InputStallError,
    InputWorkerError,
    ResumeError,
    TracingError,
    UnshardedInputError,
    UnshardedInputWarning,
    WorkerCrashLoopError,
)
from cstream.rng import get_rng_state, set_rng_state  # noqa: E402
from cstream.saving import load, save  # noqa: E402
from cstream.summaries import summarize_scalar  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CompileError", "ExhaustedIteratorError", "InputStallError", "InputWorkerError", "ResumeError",
    "UnshardedInputError", "UnshardedInputWarning", "WorkerCrashLoopError",
    "TracedStep", "TracingError", "amp", "backend", "checkpoint_closure", "compile",
    "compile_step", "current_backend", "current_executor", "distributed", "full", "full_like",
    "get_rng_state", "load", "metrics", "ones", "ones_like", "optim", "save", "set_rng_state",
    "step_closure", "summarize_scalar", "trace", "utils", "zeros", "zeros_like",
]
