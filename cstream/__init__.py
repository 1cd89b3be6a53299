"""cstream: an open implementation of the Cerebras PyTorch API.

>>> import cstream as cstorch
>>> backend = cstorch.backend("CPU")
>>> backend.shutdown()
"""

from __future__ import annotations

import os as _os

# Ray binds loopback only when this is set before it is imported (see docs/input.md, "Security defaults").
_os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from cstream import _cerebras_check  # noqa: E402,F401
from cstream import (amp, cirh, core, distributed, lib, metrics, nn, optim, profiler,  # noqa: E402
                     saver, sparse, storage, utils)
from cstream._compile import compile  # noqa: E402,A004
from cstream._trace import TracedStep, compile_step, trace  # noqa: E402
from cstream.backend import backend, current_backend, current_torch_device, use_cs  # noqa: E402
from cstream.backends import backends  # noqa: E402  (the settings object, not the module)
from cstream.closures import checkpoint_closure, current_executor, step_closure  # noqa: E402
from cstream.core.name_scope import (  # noqa: E402
    add_debug_name,
    get_debug_name,
    name_scope,
    set_debug_scope,
)
from cstream.creation import full, full_like, ones, ones_like, zeros, zeros_like  # noqa: E402
from cstream.errors import (  # noqa: E402
    AutoscaleError,
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
from cstream.rng import get_rng_state, manual_seed, set_rng_state  # noqa: E402
from cstream.checkpoint.saving import load, save  # noqa: E402
from cstream.summaries import summarize_scalar, summarize_tensor  # noqa: E402
from cstream.utils.constant import make_constant  # noqa: E402
from cstream.utils.data.utils import from_numpy, to_numpy  # noqa: E402
from cstream.utils.pol import current_pol, pol  # noqa: E402

__version__ = "2.10.0+cstream.0.1.0"
"""The Cerebras PyTorch API release cstream implements (2.10.0), and cstream's own version as
the local part: programs written for the Cerebras stack read ``cerebras.pytorch.__version__``
as the stack's release (the Model Zoo stamps it into its checkpoints and checks a checkpoint's
major.minor against it; a local version is taken as compatible)."""

_generating_docs = False
"""The Cerebras package's flag for building its documentation (some imports are skipped then);
never set in cstream."""

__all__ = [
    "AutoscaleError", "CompileError", "ExhaustedIteratorError", "InputStallError", "InputWorkerError",
    "ResumeError",
    "UnshardedInputError", "UnshardedInputWarning", "WorkerCrashLoopError",
    "TracedStep", "TracingError", "amp", "backend", "checkpoint_closure", "compile",
    "compile_step", "current_backend", "current_executor", "distributed", "full", "full_like",
    "get_rng_state", "load", "metrics", "ones", "ones_like", "optim", "save", "set_rng_state",
    "step_closure", "summarize_scalar", "trace", "utils", "zeros", "zeros_like",
    "add_debug_name", "core", "current_pol", "experimental", "from_numpy", "get_debug_name",
    "make_constant", "manual_seed", "name_scope", "nn", "pol", "profiler", "set_debug_scope",
    "sparse", "summarize_tensor", "to_numpy", "use_cs", "backends", "current_torch_device",
    "cirh", "lib", "saver", "storage",
]

# cstream.experimental holds the same names (and its own two): the top level's are copied into
# it here, once they are all bound, and its subpackage paths alias the top level's.
from cstream import experimental  # noqa: E402
import sys as _sys  # noqa: E402

experimental.__dict__.update({n: globals()[n] for n in __all__ if n != "experimental"})
experimental.__all__ = [n for n in __all__ if n != "experimental"] + experimental.__all__
for _name in ("amp", "distributed", "metrics", "optim", "utils"):
    _sys.modules[f"cstream.experimental.{_name}"] = globals()[_name]
