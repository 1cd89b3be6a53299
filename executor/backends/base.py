"""The backend interface: compile a model, run a traced step, start a run, keep checkpoints."""

from __future__ import annotations

import contextlib
import enum
import os
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Protocol

import torch

from executor import runtime
from executor.backends.options import BackendOptions


class BackendType(enum.Enum):
    CPU = "CPU"
    GPU = "GPU"
    CSX = "CSX"

    @property
    def is_cpu(self) -> bool:
        return self is BackendType.CPU

    @property
    def is_gpu(self) -> bool:
        return self is BackendType.GPU

    @property
    def is_csx(self) -> bool:
        return self is BackendType.CSX

    @staticmethod
    def from_str(name: str) -> "BackendType":
        """``"csx"`` / ``"CSX"`` -> ``BackendType.CSX``; an error naming the choices."""
        try:
            return BackendType[name.upper()]
        except (KeyError, AttributeError):
            raise ValueError(
                f"Invalid Cerebras PyTorch backend type specified. Expected one of "
                f"{[t.name for t in BackendType]}. Got {name}. ") from None


class DeviceConfig:
    """``backend.device.config`` of the Cerebras API. ``drop_data`` is the backend's own
    (``cstream.backend("CSX", drop_data=...)``; False elsewhere). ``lazy_initialization``
    (initialise parameters on the device instead of in the client) is accepted and recorded in
    the run's profile: cstream's CSX backend always creates parameters lazily."""

    def __init__(self, backend: "Backend"):
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "lazy_initialization", True)

    @property
    def drop_data(self) -> bool:
        return bool(getattr(self._backend, "drop_data", False))

    @drop_data.setter
    def drop_data(self, value: bool) -> None:
        if hasattr(self._backend, "drop_data"):
            self._backend.drop_data = bool(value) or self._backend.forces_single_step
        elif value:
            raise ValueError(f'drop_data=True: the {self._backend.name} backend has no '
                             'wafer to drop data on; it is an option of cstream.backend("CSX").')

    def __setattr__(self, name, value):
        if name == "drop_data":
            DeviceConfig.drop_data.fset(self, value)
            return
        if name != "lazy_initialization":
            raise AttributeError(f"backend.device.config has no setting {name!r}; the settings "
                                 "are drop_data and lazy_initialization.")
        object.__setattr__(self, name, value)
        self._backend.accepted_without_effect["device.config.lazy_initialization"] = value


class Device:
    """``with backend.device:`` -- tensors created inside live on the backend's device."""

    def __init__(self, backend: "Backend", torch_device: str = "cpu"):
        self.backend = backend
        self.type = backend.name
        self.torch_device = torch.device(torch_device)
        self.config = DeviceConfig(backend)
        self._stack = []

    def __enter__(self):
        cm = self.backend.device_context()
        self._stack.append(cm)
        cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._stack.pop().__exit__(*exc)

    def __repr__(self) -> str:
        return f"Device({self.type!r}, {self.torch_device})"


class CompiledModel:
    """What :func:`cstream.compile` returns: calling it runs the model on the backend.

    Attribute access (``eval()``, ``train()``, ``state_dict()``, submodules ...) goes to the model.
    """

    def __init__(self, model: torch.nn.Module, backend: "Backend"):
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "backend", backend)
        if not hasattr(model, "device"):  # the module says where it runs, as the Cerebras stack's
            model.device = backend.device.torch_device

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __setattr__(self, name, value):
        setattr(self.model, name, value)

    @property
    def device(self) -> torch.device:
        """The torch device of the backend (``t.to(compiled_model.device)`` in a step moves
        nothing: the step's tensors are there already)."""
        return self.backend.device.torch_device

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def __repr__(self) -> str:
        return f"CompiledModel(backend={self.backend.name}, model={self.model!r})"


@dataclass(frozen=True)
class RunContext:
    """What a backend's run is given of its :class:`~executor.data_executor.DataExecutor`: the
    input, the layout, the steps and the checkpoint steps (counted from 0), the closure queue
    of the current step, and where the client is."""

    dataloader: Any
    cs_config: Any
    num_steps: int
    checkpoint_steps: frozenset
    closures: Any  # executor.data_executor.ClosureQueue
    iteration: Callable[[], int]
    """The step the client is on (counted from 0; -1 before the first)."""

    def is_checkpoint_step(self, step: int) -> bool:
        return step in self.checkpoint_steps


class Run(Protocol):
    """One iteration of a :class:`~executor.data_executor.DataExecutor` on a backend, as
    :meth:`Backend.start_run` returns it.

    ``step`` is counted from 0. For every step the executor calls :meth:`next_batch`, yields
    the batch to the loop body, then calls :meth:`end_step`, runs the step's closures (a
    checkpoint closure inside :meth:`checkpoint_reads`; a step closure on the arguments
    :meth:`materialize` returns, inside :meth:`closure_reads`) and :meth:`step_done`. It calls
    :meth:`close` once when the run ends, however it ends.

    What only a run on a wafer offers (the steps run ahead of the client, and the wafer
    reports per-step figures) is asked for through :attr:`has_wafer`, :meth:`wafer_stats` and
    :meth:`progress_stats`, which say "none" on an eager run.
    """

    has_wafer: bool
    """True where the steps run on a wafer, ahead of the client; False where the client runs
    each step itself (eager)."""

    def next_batch(self, step: int) -> Any:
        """The batch the loop body gets for ``step`` (on a wafer: placeholders for the batch
        the input workers stream to it)."""

    def end_step(self, step: int) -> dict:
        """The loop body of ``step`` finished; its closures run next. Returns figures for the
        step's record (``"samples"``: samples in the step), or ``{}``."""

    def checkpoint_reads(self, step: int) -> ContextManager:
        """Around a checkpoint closure of ``step``: state reads return the values after
        ``step``."""

    def materialize(self, obj: Any, step: int) -> Any:
        """``obj`` (a step closure's arguments) with every output of ``step`` replaced by its
        value."""

    def closure_reads(self, step: int) -> ContextManager:
        """Around a step closure of ``step``: reads of readable state (metrics) return the
        values after ``step``."""

    def step_done(self, step: int) -> None:
        """The client finished ``step`` and its closures."""

    def samples_in_step(self, step: int) -> int:
        """Samples in the batch of ``step`` (when :meth:`end_step` did not say)."""

    def worker_states(self, step: int) -> list:
        """Every input worker's position after ``step`` (a checkpoint step), in worker order:
        what ``DataLoader.state_dict()`` saves."""

    def autoscale_state(self, step: int) -> Optional[dict]:
        """An autoscaled run's controller state after ``step`` (a checkpoint step), saved with
        the workers' positions; None: the run does not autoscale."""

    def wafer_stats(self) -> Optional[dict]:
        """The wafer's per-step figures received so far, by step counted from 1; None where
        the steps have no wafer (a step's record is complete when the client ends it)."""

    def progress_stats(self, step: int) -> Optional[dict]:
        """The wafer's newest per-step figures, fetched now (waits for ``step`` to finish on
        the wafer); None where there is no wafer or before it started."""

    def close(self, ok: bool) -> dict:
        """End the run (``ok``: every step ran) and release what it holds; returns the run's
        summary for its profile."""


class Backend:
    """Base class. Subclasses implement :meth:`start_run`, and may override :meth:`compile`,
    :meth:`run_step`, :meth:`device_context` and the creation ops."""

    name = "?"
    forces_single_step = False
    def __init__(self, options: BackendOptions, torch_device: str = "cpu",
                 mixed_precision: Optional[bool] = None):
        self.options = options
        """The options the backend was created with (:mod:`executor.backends.options`)."""
        self.mixed_precision = mixed_precision
        """Automatic mixed precision of steps: True/False, or None to follow cstream.amp's
        setting (``cstream.backend(..., mixed_precision=...)``; see cstream.amp.precision)."""
        # resolved here, on the client: a relative path means the user's working directory,
        # not that of a Ray worker on an existing cluster
        self.artifact_dir = (Path(options.artifact_dir) if options.artifact_dir
                             else Path("cstream_logs")).resolve()
        self.max_checkpoints = options.max_checkpoints
        self.device = Device(self, torch_device)
        self._checkpoints: deque[Path] = deque()
        self._alive = True
        self._stateful: "weakref.WeakSet" = weakref.WeakSet()
        self.is_tracing = False
        """True while the step function runs (is traced on CSX, runs eagerly elsewhere)."""
        self.accepted_without_effect: dict = {}
        """Cerebras options this run accepted that change nothing here (the run's profile
        lists them under ``accepted_without_effect``)."""
        # checkpoint closures called before a run: (fn, args, kwargs), run as the next run starts
        self.initial_closures: list = []
        runtime.set_backend(self)

    @property
    def backend_type(self) -> "BackendType":
        return BackendType[self.name]

    @property
    def is_csx(self) -> bool:
        return self.name == "CSX"

    @property
    def is_cpu(self) -> bool:
        return self.name == "CPU"

    @property
    def is_gpu(self) -> bool:
        return self.name == "GPU"

    @property
    def _impl(self) -> "Backend":
        """The implementation behind the backend, which programs for the Cerebras stack read as
        ``backend._impl`` (``cstream.backend.current_backend_impl()``): here the backend itself."""
        return self

    @property
    def is_e2e_execution(self) -> bool:
        """Whether runs execute (False for a CSX backend that only compiles or validates)."""
        return not (getattr(self.options, "compile_only", False)
                    or getattr(self.options, "validate_only", False))

    @property
    def torch_device(self) -> torch.device:
        return self.device.torch_device

    # -- the interface -------------------------------------------------------------------
    def compile(self, model: torch.nn.Module) -> CompiledModel:
        return CompiledModel(model, self)

    def run_step(self, traced, args, kwargs):
        return traced.run(*args, **kwargs)

    def start_run(self, context: RunContext) -> Run:
        """Start a run of ``context``'s executor on this backend."""
        raise NotImplementedError

    def device_context(self):
        return contextlib.nullcontext()

    def full(self, size, fill_value, dtype=None):
        return torch.full(size, fill_value, dtype=dtype, device=self.device.torch_device)

    def full_like(self, other, fill_value, dtype=None):
        return torch.full_like(other, fill_value, dtype=dtype)

    def state_tensor(self, tensor, readable=False):
        return tensor

    def register_stateful(self, obj) -> None:
        """Objects whose state must exist before a step is traced (optimizers): the engine
        calls their ``ensure_preinitialized()`` first."""
        self._stateful.add(obj)

    def preinitialize_all(self) -> None:
        for obj in list(self._stateful):
            obj.ensure_preinitialized()

    # -- randomness ----------------------------------------------------------------------------
    def get_rng_state(self) -> torch.Tensor:
        """The state of the generator the step's random ops draw from (eager: this process's)."""
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        """Seed this process's generators and the step's generator with ``seed``."""
        torch.manual_seed(seed)
        self.set_rng_state(torch.get_rng_state())

    # -- checkpoint retention ------------------------------------------------------------
    def register_checkpoint(self, path) -> None:
        """Called by :func:`cstream.save`; keeps only the newest ``max_checkpoints`` files."""
        path = Path(path).resolve()
        if path in self._checkpoints:
            self._checkpoints.remove(path)
        self._checkpoints.append(path)
        if self.max_checkpoints is None:
            return
        while len(self._checkpoints) > self.max_checkpoints:
            old = self._checkpoints.popleft()
            with contextlib.suppress(FileNotFoundError):
                os.remove(old)

    def shutdown(self) -> None:
        """Release the backend's resources; afterwards a new backend may be created."""
        self._alive = False
        runtime.clear_backend(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(artifact_dir={str(self.artifact_dir)!r})"
