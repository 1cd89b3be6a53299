"""The options of each backend, defined once: one typed dataclass per backend.

``cstream.backend(name, **options)``, an experiment file's ``backend.options`` and the
``cstream run`` command line all fill the same dataclass, and its ``__post_init__`` is the one
place the values are checked.

>>> CSXOptions(lookahead=8, compiler="fx").lookahead
8
>>> CSXOptions.from_kwargs({"lookahed": 8})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
TypeError: cstream.backend("CSX") got an unknown option 'lookahed'. Did you mean 'lookahead'? ...
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional, Union, get_args

from workers.checks import known_names, positive_int
from workers.flow import DEFAULT_LOOKAHEAD_STEPS

Compiler = Literal["auto", "fx", "inductor"]
"""How the wafer runs a traced step: ``"auto"`` (the fx graph at once, inductor compiled in the
background when the run is long enough, then kept if its steps are faster), ``"fx"`` or
``"inductor"`` (force one)."""

PathLike = Union[str, os.PathLike, None]

CudaGraph = Union[bool, Literal["auto"]]
"""Whether a CUDA wafer replays the step as a CUDA graph: ``"auto"``, ``True`` or ``False``."""


def _flags(options, *names: str) -> None:
    """Coerce the boolean options ``names`` to bool (``0``/``1`` count); a string is refused,
    since ``"false"`` would read as True."""
    for name in names:
        value = getattr(options, name)
        if isinstance(value, str):
            raise TypeError(f'cstream.backend("{options.backend_name}", {name}={value!r}): '
                            "expected True or False, got a string.")
        object.__setattr__(options, name, bool(value))


def _max_checkpoints(options) -> None:
    positive_int(options.max_checkpoints, "max_checkpoints", allow_none=True,
                 fix="Set it to 1 or more, or None to keep every checkpoint.")


class _Options:
    """What every backend's options dataclass shares: the name check and the listing."""

    backend_name: ClassVar[str] = "?"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in the order the backend documents them."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, given: dict):
        """The options from ``cstream.backend(name, **given)``; an unknown name is a TypeError
        naming the closest valid one and all of them."""
        known_names(given, cls.names(), what="option", error=TypeError,
                    where=f'cstream.backend("{cls.backend_name}") got an unknown')
        return cls(**given)

    def given(self) -> dict:
        """The options that differ from their defaults, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}


@dataclass(frozen=True, kw_only=True)
class CPUOptions(_Options):
    """``cstream.backend("CPU", ...)``: eager PyTorch in one process."""

    backend_name: ClassVar[str] = "CPU"

    artifact_dir: PathLike = None
    """Where runs write ``executors/NNNNNN/`` and checkpoints (default ``cstream_logs``)."""
    max_checkpoints: Optional[int] = None
    """Keep only the newest N checkpoints that :func:`cstream.save` wrote; None keeps all."""

    def __post_init__(self):
        _max_checkpoints(self)


@dataclass(frozen=True, kw_only=True)
class GPUOptions(_Options):
    """``cstream.backend("GPU", ...)``: eager PyTorch on one CUDA device."""

    backend_name: ClassVar[str] = "GPU"

    artifact_dir: PathLike = None
    """Where runs write ``executors/NNNNNN/`` and checkpoints (default ``cstream_logs``)."""
    max_checkpoints: Optional[int] = None
    """Keep only the newest N checkpoints that :func:`cstream.save` wrote; None keeps all."""
    device_index: int = 0
    """The CUDA device the model and the steps run on (``cuda:<device_index>``)."""

    def __post_init__(self):
        _max_checkpoints(self)
        if (isinstance(self.device_index, bool) or not isinstance(self.device_index,
                                                                  numbers.Integral)
                or self.device_index < 0):
            raise ValueError(f"device_index: expected an int of 0 or more (a CUDA device), got "
                             f"{self.device_index!r}. Set it to 0 for the first GPU.")


@dataclass(frozen=True, kw_only=True)
class CSXOptions(_Options):
    """``cstream.backend("CSX", ...)``: the simulated Wafer-Scale Cluster.

    The first seven are the Cerebras API's; the rest are cstream's own (where and how the
    simulated wafer runs). With the same thread count, the fx replay gives the CPU backend's
    numbers bit for bit.
    """

    backend_name: ClassVar[str] = "CSX"

    artifact_dir: PathLike = None
    """Where runs write ``executors/NNNNNN/`` and checkpoints (default ``cstream_logs``)."""
    compile_dir: PathLike = None
    """Where compiled steps are cached (default ``<artifact_dir>/cached_compile``)."""
    compile_only: bool = False
    """Trace and compile the step, run nothing (the data is dropped: ``drop_data``)."""
    validate_only: bool = False
    """Trace and check the step, compile and run nothing (the data is dropped). The step is
    traced for ``device`` (no GPU needed for ``"cuda"``); ``last_compile["device_bound_ops"]``
    lists what in it cannot run there."""
    drop_data: bool = False
    """Keep no parameter values: a checkpoint holding every state tensor must be loaded before a
    run."""
    max_checkpoints: Optional[int] = None
    """Keep only the newest N checkpoints that :func:`cstream.save` wrote; None keeps all."""
    retrace_every_iteration: bool = False
    """Trace the step again on every iteration instead of once."""
    in_process: bool = False
    """Run the wafer driver and the input workers in this process (no Ray; the input workers
    then run one after another)."""
    address: Optional[str] = None
    """An existing Ray cluster to run on; :func:`cstream.backend` fills it from ``RAY_ADDRESS``
    when not given."""
    device: str = "cpu"
    """Where the wafer driver executes the step: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
    compiler: Compiler = "auto"
    """How the wafer runs the traced step (:data:`Compiler`)."""
    lookahead: int = DEFAULT_LOOKAHEAD_STEPS
    """Steps the wafer may run past the client's last finished step."""
    num_threads: Optional[int] = None
    """Threads the driver runs the step's ops on; None: on Ray chosen from the step
    (:func:`executor.driver.threads_for_step`), in-process this process's setting (which is
    process-wide)."""
    cuda_graph: CudaGraph = "auto"
    """On ``device="cuda"``: replay the step as a CUDA graph recorded once
    (:mod:`executor.wafer.cuda_graph`). ``"auto"``: where the step can be recorded, else the
    plain replay, and the run summary says why; ``True``: a step that cannot be recorded is an
    error; ``False``: never. Only CUDA wafers record graphs."""

    def __post_init__(self):
        _flags(self, "compile_only", "validate_only", "drop_data", "retrace_every_iteration",
               "in_process")
        _max_checkpoints(self)
        if self.compiler not in get_args(Compiler):
            raise ValueError(f'cstream.backend("CSX", compiler={self.compiler!r}): choose one of '
                             f"{get_args(Compiler)}.")
        device = str(self.device)
        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise ValueError(f'cstream.backend("CSX", device={self.device!r}): the wafer driver '
                             'executes on "cpu" or "cuda".')
        object.__setattr__(self, "device", device)
        if not (isinstance(self.cuda_graph, bool) or self.cuda_graph == "auto"):
            raise ValueError(f'cstream.backend("CSX", cuda_graph={self.cuda_graph!r}): choose '
                             'True, False or "auto".')
        if self.cuda_graph is True and not device.startswith("cuda"):
            raise ValueError(f'cstream.backend("CSX", cuda_graph=True, device={device!r}): CUDA '
                             'graphs are recorded on a CUDA wafer only. Set device="cuda", or '
                             'leave cuda_graph at "auto".')
        positive_int(self.lookahead, "lookahead",
                     fix="Set it to 1 or more (steps the wafer may run ahead of the client).")
        positive_int(self.num_threads, "num_threads", allow_none=True,
                     fix="Set it to 1 or more (threads for the wafer's ops), or None to choose "
                         "from the step.")


OPTIONS: dict[str, type] = {"CSX": CSXOptions, "CPU": CPUOptions, "GPU": GPUOptions}
"""Each backend's options dataclass, by the backend's name."""

BackendOptions = Union[CPUOptions, GPUOptions, CSXOptions]
