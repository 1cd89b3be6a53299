"""``cstream.backend(name, **options)``: create the (single) current backend.

Also the Cerebras API's names around it: :class:`Backend` (the class of every backend),
:class:`BackendType`, :func:`get_backend_args` (the arguments ``backend(kind, ...)`` takes),
:func:`current_backend_impl`, :func:`current_torch_device`, and :mod:`.ltc_backend`'s hooks.
"""

from __future__ import annotations

import dataclasses
import inspect
import os

import torch

from executor import runtime
from executor.backends import CPUBackend, GPUBackend
from executor.backends.base import Backend as Backend  # the class of every backend
from executor.backends.base import BackendType
from executor.backends.options import OPTIONS, BackendOptions, CSXOptions

BACKENDS = {"CPU": CPUBackend, "GPU": GPUBackend}

# Options of the Cerebras API's backends that change nothing in cstream: accepted, recorded in
# the backend's ``accepted_without_effect`` (and the run's profile). Why, per option:
WITHOUT_EFFECT = {
    "CSX": {
        "use_cs_grad_accum": "the simulated wafer runs each CS-X's batch whole (no micro-batches)",
        "micro_batch_size": "the simulated wafer runs each CS-X's batch whole (no micro-batches)",
    },
    "CPU": {},
    "GPU": {
        "enable_distributed": "cstream's GPU backend runs on one device",
        "main_process_id": "cstream's GPU backend runs on one device",
        "dist_backend": "cstream's GPU backend runs on one device",
        "init_method": "cstream's GPU backend runs on one device",
        "sync_batchnorm": "cstream's GPU backend runs on one device",
    },
}


def _csx_backend():
    from executor.backends.csx import CSXBackend

    return CSXBackend


def resolve_csx_options(options: CSXOptions) -> CSXOptions:
    """The CSX backend's options with what comes from the environment filled in, read here
    once: ``RAY_ADDRESS`` (an existing Ray cluster) when no ``address`` is given."""
    if options.address is None and os.environ.get("RAY_ADDRESS"):
        return dataclasses.replace(options, address=os.environ["RAY_ADDRESS"])
    return options


def backend_options(backend_type: str, **options) -> BackendOptions:
    """The typed options (:mod:`executor.backends.options`) of ``cstream.backend(backend_type,
    **options)``, checked, with the environment's part filled in; the Cerebras API's options
    that change nothing here and ``mixed_precision`` are not among them.

    >>> backend_options("CSX", lookahead=8, in_process=True).lookahead
    8
    """
    key = _backend_key(backend_type)
    built = OPTIONS[key].from_kwargs(options)
    return resolve_csx_options(built) if key == "CSX" else built


def _backend_key(backend_type) -> str:
    if isinstance(backend_type, BackendType):
        return backend_type.name
    if not isinstance(backend_type, str):
        raise TypeError(f"backend_type: expected a string such as 'CSX' or 'CPU' or a BackendType, "
                        f"got {backend_type!r}")
    key = backend_type.upper()
    if key not in OPTIONS:
        raise ValueError(
            f"unknown backend type {backend_type!r}; choose one of {', '.join(map(repr, OPTIONS))}."
        )
    return key


def backend(backend_type: str | None = None, *args, **options):
    """Create the backend every cstream call uses from now on.

    ``backend_type`` is ``"CSX"`` (the simulated Wafer-Scale Cluster), ``"CPU"`` (eager, one
    process: the debugging path) or ``"GPU"`` (eager on CUDA). The options fill the backend's
    options dataclass (:class:`~executor.backends.options.CSXOptions`, ``CPUOptions``,
    ``GPUOptions``: ``artifact_dir``, ``max_checkpoints`` and, for CSX, ``compile_dir``,
    ``compile_only``, ``validate_only``, ``drop_data``, ``retrace_every_iteration`` and more),
    which the backend keeps as ``backend.options``. The Cerebras API's options that change
    nothing here (:data:`WITHOUT_EFFECT`: ``use_cs_grad_accum``, ``micro_batch_size``, the GPU's
    distributed settings) are accepted and listed in the backend's ``accepted_without_effect``.

    >>> import cstream
    >>> b = cstream.backend("CPU", max_checkpoints=2)
    >>> b.name, cstream.current_backend() is b
    ('CPU', True)
    >>> b.shutdown()

    With no arguments it returns the current backend, as the Cerebras API does (an error when
    there is none). Options may also be given by position, in the order of
    :func:`get_backend_args` (``artifact_dir`` first), as the Cerebras API takes them.
    """
    if args:
        names = [n for n in get_backend_args(backend_type) if n not in ("self", "backend_type")]
        if len(args) > len(names):
            raise TypeError(f"backend({backend_type!r}, ...) takes at most {len(names)} options "
                            f"by position ({', '.join(names)}); {len(args)} were given.")
        for name, value in zip(names, args):
            if name in options:
                raise TypeError(f"backend({backend_type!r}, ...): {name} given by position and "
                                f"by name.")
            options[name] = value
    if backend_type is None:
        if options:
            raise ValueError(
                f"backend(**{sorted(options)}): options need a backend type, e.g. "
                "cstream.backend('CSX', ...); cstream.backend() alone returns the current one.")
        return current_backend_impl()
    key = _backend_key(backend_type)
    cls = _csx_backend() if key == "CSX" else BACKENDS[key]
    without_effect = {k: options.pop(k) for k in list(options) if k in WITHOUT_EFFECT[key]}
    existing = runtime.current_backend()
    if existing is not None:
        raise RuntimeError(
            f"a {existing.name} backend already exists and cstream runs one backend at a time. "
            "Get it with cstream.current_backend(), or call its .shutdown() before creating "
            f"a {key} backend."
        )
    cluster_config = options.pop("cluster_config", None) if key == "CSX" else None
    mixed_precision = options.pop("mixed_precision", None)
    if mixed_precision is not None and not isinstance(mixed_precision, bool):
        raise TypeError(f"mixed_precision: expected True or False, got {mixed_precision!r}.")
    created = cls(backend_options(key, **options), mixed_precision=mixed_precision)
    if key == "CSX":
        from cstream.distributed.cluster_config import ClusterConfig, attach_cluster

        attach_cluster(created, cluster_config if cluster_config is not None else ClusterConfig())
    created.accepted_without_effect.update(
        {f"backend.{k}": v for k, v in without_effect.items() if v is not None})
    return created


def use_cs() -> bool:
    """True when the current backend is the (simulated) Cerebras system, CSX, and inside the
    CSX backend's input workers (which exist only for CSX runs)."""
    from workers.context import is_streamer

    b = runtime.current_backend()
    return (b is not None and b.is_csx) or is_streamer()


def current_backend_impl(raise_exception: bool = True):
    """The current backend (the Cerebras API's name for the object behind it); when there is
    none, an error, or None with ``raise_exception=False``."""
    b = runtime.current_backend()
    if b is None and raise_exception:
        raise RuntimeError("No backend has been created: call cstream.backend(...) first.")
    return b


def current_torch_device() -> torch.device:
    """The torch device of the current backend's tensors; ``cpu`` when there is no backend."""
    b = runtime.current_backend()
    return torch.device("cpu") if b is None else b.device.torch_device


def get_backend_args(backend_type) -> dict[str, inspect.Parameter]:
    """The arguments of ``backend(backend_type, ...)``, by name, as ``inspect.Parameter`` s with
    their defaults: ``self``, ``backend_type``, the options of its dataclass
    (:mod:`executor.backends.options`), ``mixed_precision``, ``cluster_config`` (CSX) and the
    Cerebras options accepted without effect."""
    key = _backend_key(backend_type)
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("backend_type", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(f.name, kw, default=f.default)
               for f in dataclasses.fields(OPTIONS[key])]
    params.append(inspect.Parameter("mixed_precision", kw, default=None))
    if key == "CSX":
        params.append(inspect.Parameter("cluster_config", kw, default=None))
    params += [inspect.Parameter(name, kw, default=None) for name in WITHOUT_EFFECT[key]]
    return {p.name: p for p in params}


def current_backend(raise_exception: bool = False, raise_warning: bool = True):
    """The backend created by :func:`backend`; when there is none, None, or an error with
    ``raise_exception=True`` (the Cerebras API 2.10's default; cstream's keeps the earlier
    releases' None). ``raise_warning`` is accepted without effect."""
    return current_backend_impl(raise_exception=raise_exception)
