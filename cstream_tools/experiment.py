"""Experiments: typed configuration of one run, filled from YAML, and the code that runs it.

The dataclasses below (and each backend's options dataclass, :mod:`executor.backends.options`)
are the single source of truth: every field is checked in ``__post_init__``; a YAML file only
fills them (:func:`load_experiment`). Errors name the path of
the wrong value in the file, e.g. ``cs_config.num_workers_per_csx: expected a positive int, got
'four'``, and a wrong key names itself and the valid keys.

>>> exp = experiment_from_dict({
...     "input": {"fn": "synthetic", "kwargs": {"batch_size": 4, "cost_ms": 0}},
...     "model": None, "steps": 3, "backend": {"type": "CPU"}})
>>> result = run_experiment(exp, artifact_dir="cstream_logs")
>>> result.report["steps"], result.report["samples"]
(3, 12)
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Optional, Union, get_args, get_origin, get_type_hints

import torch

from executor.backends.options import OPTIONS, BackendOptions
from executor.data_executor import stop_reason
from workers.checks import known_names, positive_int
from workers.config import CSConfig


class ExperimentError(ValueError):
    """An experiment file or mapping is not a valid experiment."""


def _show(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _string(name, value):
    if not isinstance(value, str) or not value:
        raise ExperimentError(f"{name}: expected a non-empty string, got {_show(value)}.")


def _mapping(name, value):
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ExperimentError(f"{name}: expected a mapping of names to values, got "
                              f"{_show(value)}.")


# -- built-ins -------------------------------------------------------------------------------------
def _builtin_mlp(in_features: int = 64, hidden: int = 128, out_features: int = 10,
                 layers: int = 2) -> torch.nn.Module:
    mods: list[torch.nn.Module] = []
    width = in_features
    for _ in range(layers):
        mods += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    mods.append(torch.nn.Linear(width, out_features))
    return torch.nn.Sequential(*mods)


def _builtin_linear(in_features: int = 64, out_features: int = 10) -> torch.nn.Module:
    return torch.nn.Linear(in_features, out_features)


BUILTIN_MODELS: dict[str, Callable[..., torch.nn.Module]] = {
    "mlp": _builtin_mlp, "linear": _builtin_linear}
BUILTIN_INPUTS = {"synthetic": "cstream_tools.synthetic:synthetic_input_fn"}
LOSSES = {"cross_entropy": torch.nn.functional.cross_entropy, "mse": torch.nn.functional.mse_loss}


def resolve(path: str, what: str):
    """Import ``"package.module:name"`` (or ``"package.module.name"``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ExperimentError(f"{what}: {path!r} is not an import path; write it as "
                              "'package.module:name'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ExperimentError(f"{what}: cannot import module {module_name!r} ({e}). Run from the "
                              "directory that holds it or add it to PYTHONPATH.") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ExperimentError(f"{what}: module {module_name!r} has no {attr!r}.")
        obj = getattr(obj, part)
    return obj


# -- the typed configuration -----------------------------------------------------------------------
@dataclass(kw_only=True)
class InputConfig:
    """The input function every input worker calls to build its dataloader."""

    fn: str
    """Import path ``"package.module:function"``, or ``"synthetic"`` (batches of a known
    per-batch cost: :func:`cstream_tools.synthetic.synthetic_input_fn`)."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the input function."""

    def __post_init__(self):
        _string("fn", self.fn)
        _mapping("kwargs", self.kwargs)

    def build(self):
        """The cstream DataLoader of this input function."""
        from workers.dataloader import DataLoader

        fn = resolve(BUILTIN_INPUTS.get(self.fn, self.fn), "input.fn")
        if not callable(fn):
            raise ExperimentError(
                f"input.fn: {self.fn!r} is a {type(fn).__name__}, not a function.")
        return DataLoader(fn, **self.kwargs)


@dataclass(kw_only=True)
class ModelConfig:
    """The model trained by the experiment's step: ``loss(model(inputs), targets)``."""

    name: str
    """A built-in (``"mlp"``, ``"linear"``) or an import path ``"package.module:Class"``."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the model's constructor."""
    loss: Literal["cross_entropy", "mse"] = "cross_entropy"
    """``"cross_entropy"`` or ``"mse"``."""

    def __post_init__(self):
        _string("name", self.name)
        _mapping("kwargs", self.kwargs)
        if self.loss not in LOSSES:
            raise ExperimentError(f"loss: expected one of {', '.join(LOSSES)}, got "
                                  f"{_show(self.loss)}.")

    def build(self) -> torch.nn.Module:
        factory = BUILTIN_MODELS.get(self.name) or resolve(self.name, "model.name")
        model = factory(**self.kwargs)
        if not isinstance(model, torch.nn.Module):
            raise ExperimentError(f"model.name: {self.name!r} built a {type(model).__name__}, "
                                  "not a torch.nn.Module.")
        return model


@dataclass(kw_only=True)
class BackendConfig:
    """Which backend runs the experiment, and its options (``cstream.backend(type, **options)``)."""

    type: Literal["CSX", "CPU", "GPU"] = "CSX"
    """``"CSX"`` (the simulated wafer), ``"CPU"`` or ``"GPU"``."""
    options: Union[BackendOptions, dict] = field(default_factory=dict)
    """The backend's options dataclass (:mod:`executor.backends.options`), or a mapping that
    fills it, e.g. ``in_process``, ``lookahead``, ``compiler`` for CSX. ``artifact_dir`` is the
    experiment's own."""

    def __post_init__(self):
        if not isinstance(self.type, str) or self.type.upper() not in OPTIONS:
            raise ExperimentError(f"type: expected one of {', '.join(OPTIONS)}, got "
                                  f"{_show(self.type)}.")
        self.type = self.type.upper()
        kind = OPTIONS[self.type]
        if not isinstance(self.options, kind):
            self.options = _backend_options(kind, self.options)
        if self.options.artifact_dir is not None:
            raise ExperimentError("options: artifact_dir is set by the experiment's artifact_dir "
                                  "(or --artifact-dir), not among the backend options.")


def _backend_options(kind: type, options: dict) -> BackendOptions:
    """``kind`` (a backend's options dataclass) filled from a mapping; errors name the option."""
    _mapping("options", options)
    valid = kind.names()
    known_names(options, valid, what="option", where=f"options: unknown {kind.backend_name}",
                error=ExperimentError)
    try:
        return kind(**options)
    except (ValueError, TypeError) as e:
        msg = str(e)
        raise ExperimentError(f"options.{msg}" if msg.split(":", 1)[0] in valid
                              else f"options: {msg}") from None


@dataclass(kw_only=True)
class Experiment:
    """One run: cluster layout, input function, model and optimizer, steps and backend."""

    name: str = "experiment"
    """Shown in tables; the file's stem when loaded from YAML without a name."""
    cs_config: CSConfig = field(default_factory=CSConfig)
    """The simulated cluster (num_csx, num_workers_per_csx, wafer_samples_per_sec, ...)."""
    input: InputConfig
    """The input function."""
    model: Optional[ModelConfig] = None
    """The model; null runs the input pipeline alone against the simulated wafer."""
    optimizer: Optional[dict] = None
    """``cstream.optim.configure_optimizer`` arguments: ``optimizer_type`` and its kwargs."""
    learning_rate: Union[float, dict, list, None] = None
    """``cstream.optim.configure_lr_scheduler``'s ``learning_rate`` (a number, a scheduler mapping
    or a list of them); null: the optimizer's own ``lr``, unscheduled."""
    steps: int
    """Steps to run."""
    checkpoint_steps: Optional[int] = None
    """Save a checkpoint every N steps (and on the last); null: none."""
    backend: BackendConfig = field(default_factory=BackendConfig)
    """The backend and its options."""
    artifact_dir: str = "cstream_logs"
    """Where runs write ``executors/NNNNNN/`` (profile, steps, TensorBoard) and checkpoints."""
    seed: int = 0
    """``torch.manual_seed`` before the model is built."""

    def __post_init__(self):
        _string("name", self.name)
        positive_int(self.steps, "steps", error=ExperimentError)
        positive_int(self.checkpoint_steps, "checkpoint_steps", allow_none=True,
                     fix="Set it to 1 or more, or null for no checkpoints.", error=ExperimentError)
        _string("artifact_dir", self.artifact_dir)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ExperimentError(f"seed: expected an int, got {_show(self.seed)}.")
        if self.model is not None:
            if self.optimizer is None:
                raise ExperimentError(
                    "optimizer: a model needs an optimizer, e.g. optimizer: {optimizer_type: SGD, "
                    "lr: 0.1}; or set model: null to profile the input pipeline alone.")
        if self.optimizer is not None:
            _mapping("optimizer", self.optimizer)
            kind = self.optimizer.get("optimizer_type")
            if not isinstance(kind, str) or not kind:
                raise ExperimentError(
                    "optimizer.optimizer_type: expected the optimizer's name (e.g. SGD, Adam), got "
                    f"{_show(kind)}.")
            if "params" in self.optimizer:
                raise ExperimentError("optimizer.params: the model's parameters are passed by the "
                                      "experiment; remove params.")
        lr = self.learning_rate
        if lr is not None and not (
                (isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr))
                or isinstance(lr, dict)
                or (isinstance(lr, list) and lr and all(isinstance(x, dict) for x in lr))):
            raise ExperimentError(
                "learning_rate: expected a number, a scheduler mapping (scheduler: ...) or a list "
                f"of them, got {_show(lr)}.")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# -- filling the dataclasses from mappings ---------------------------------------------------------
_SHORTHANDS = {InputConfig: "fn", ModelConfig: "name", BackendConfig: "type"}


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _fill(cls, data, path: str):
    if cls in _SHORTHANDS and isinstance(data, str):
        data = {_SHORTHANDS[cls]: data}
    where = path or "the experiment"
    if not isinstance(data, dict):
        raise ExperimentError(f"{where}: expected a mapping, got {_show(data)}.")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    known_names(data, list(fields), what="key", where=f"{where}: unknown", error=ExperimentError)
    missing = [n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ExperimentError(f"{where}: missing required key {missing[0]!r}. Valid keys: "
                              f"{', '.join(fields)}.")
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        sub = f"{path}.{key}" if path else key
        inner = ([a for a in get_args(tp) if a is not type(None)]
                 if get_origin(tp) is Union else [tp])
        targets = [a for a in inner if _is_dataclass_type(a)]
        target = targets[0] if len(targets) == 1 else None  # several: the class picks by value
        if target is not None and value is not None:
            value = _fill(target, value, sub)
        elif float in inner and isinstance(value, str):
            try:  # YAML 1.1 reads 1e-3 (no dot) as a string
                value = float(value)
            except ValueError:
                pass
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        msg = str(e)
        prefix = f"{cls.__name__}."
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
        elif msg.startswith(f"{cls.__name__}: "):
            msg = msg[len(cls.__name__) + 2:]
            raise ExperimentError(f"{where}: {msg}") from None
        raise ExperimentError(f"{path}.{msg}" if path else msg) from None


def experiment_from_dict(data: dict, name: Optional[str] = None) -> Experiment:
    """An :class:`Experiment` from a mapping (a parsed YAML document); errors name the path."""
    if isinstance(data, dict) and name is not None and "name" not in data:
        data = {"name": name, **data}
    return _fill(Experiment, data, "")


def yaml_error_where(e) -> tuple[str, str]:
    """Where a ``yaml.YAMLError`` points (``" line 3, column 1"``, or ``""``) and what it says."""
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return where, getattr(e, "problem", None) or str(e).splitlines()[0]


def load_experiment(path) -> Experiment:
    """Read and check an experiment YAML file.

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "bad.yaml")
    >>> text = "input: synthetic\\nsteps: 5\\ncs_config: {num_workers_per_csx: four}\\n"
    >>> _ = open(f, "w").write(text)
    >>> load_experiment(f)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    cstream_tools.experiment.ExperimentError: bad.yaml: cs_config.num_workers_per_csx: expected a ...
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        where, problem = yaml_error_where(e)
        raise ExperimentError(f"{path.name}:{where}: not valid YAML: {problem}.") from None
    if data is None:
        raise ExperimentError(f"{path.name}: the file is empty; an experiment needs at least "
                              "input and steps.")
    try:
        return experiment_from_dict(data, name=path.stem)
    except ExperimentError as e:
        raise ExperimentError(f"{path.name}: {e}") from None


def with_layout(exp: Experiment, **changes) -> Experiment:
    """A copy of ``exp`` with ``cs_config`` fields changed (checked by CSConfig)."""
    try:
        cs = dataclasses.replace(exp.cs_config, **changes)
    except ValueError as e:
        raise ExperimentError(str(e).replace("CSConfig.", "cs_config.", 1)) from None
    return dataclasses.replace(exp, cs_config=cs)


# -- running ---------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What :func:`run_experiment` returns."""

    experiment: Experiment
    report: dict
    run_dir: Optional[Path]
    step_records: list
    wall_s: float
    last_loss: Optional[float] = None


@dataclass
class Progress:
    """What a progress callback receives after each step."""

    step: int
    num_steps: int
    loss: Optional[float]
    """The loss of step ``loss_step`` (None without a model)."""
    rate: Optional[float]
    """samples/s at the last refresh: the wafer's over its last 10 steps on CSX, the client's
    smoothed rate elsewhere (None before the second step)."""
    buffer_fill: Optional[float]
    """Batches ready per CS-X when the wafer began the step last refreshed (CSX only)."""
    loss_step: Optional[int] = None
    """The step whose loss ``loss`` is."""


def _split_batch(batch):
    if isinstance(batch, dict):
        for a, b in (("inputs", "labels"), ("inputs", "targets"), ("x", "y")):
            if a in batch and b in batch:
                return batch[a], batch[b]
    elif isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ExperimentError(
        "the experiment's training step expects batches of (inputs, targets) (a pair, or a "
        "mapping with inputs/labels or x/y); the input function yields "
        f"{type(batch).__name__} batches. Use model: null to profile the input alone.")


def _configure(optimizer_cfg: dict, learning_rate, params):
    import cstream

    conf_opt = getattr(cstream.optim, "configure_optimizer", None)
    if conf_opt is None:
        raise ExperimentError("optimizer: cstream.optim.configure_optimizer is not available in "
                              "this installation.")
    cfg = dict(optimizer_cfg)
    optimizer = conf_opt(optimizer_type=cfg.pop("optimizer_type"), params=params, **cfg)
    scheduler = None
    if learning_rate is not None:
        scheduler = cstream.optim.configure_lr_scheduler(optimizer, learning_rate=learning_rate)
    return optimizer, scheduler


def run_experiment(exp: Experiment, *, artifact_dir=None, progress: Optional[Callable] = None,
                   progress_every_s: float = 0.5, tensorboard: bool = True) -> RunResult:
    """Run ``exp`` once: build the backend, the input, the model; step; shut the backend down.

    ``progress(Progress)`` is called after every step; ``loss`` and ``buffer_fill`` are
    refreshed every ``progress_every_s`` and on the steps for which ``progress.wants(step)``
    (if it has that method) is true: reading them waits for the wafer. With ``tensorboard`` a
    ``SummaryWriter`` writes into the run's ``executors/NNNNNN/tensorboard``: every step's
    ``loss`` (``cstream.summarize_scalar``), rates, wafer and per-worker figures.

    If the run stops early (Ctrl-C, an error), the exception carries ``partial_result``: the
    :class:`RunResult` of the steps that ran, whose report is marked ``interrupted``.
    """
    import cstream

    torch.manual_seed(exp.seed)
    artifact_dir = Path(artifact_dir or exp.artifact_dir)
    writer = None
    feed = _ProgressFeed(progress, progress_every_s)
    t0 = time.perf_counter()
    backend = cstream.backend(exp.backend.type, artifact_dir=str(artifact_dir),
                              **exp.backend.options.given())
    try:
        dataloader = exp.input.build()
        step_fn, save = _training_step(exp, backend, artifact_dir)
        executor = cstream.utils.data.DataExecutor(
            dataloader, num_steps=exp.steps, checkpoint_steps=exp.checkpoint_steps,
            cs_config=exp.cs_config)
        executor.name = exp.name
        steps = iter(executor)
        try:
            for i, batch in enumerate(steps):
                if i == 0 and tensorboard:
                    writer = _tensorboard_writer(executor)
                loss = step_fn(batch) if step_fn is not None else None
                if save is not None:
                    save(i + 1)
                feed.after_step(executor, i, loss)
        except BaseException as e:
            steps.close()  # the executor writes the profile of the steps that ran
            if executor.run_dir is not None:
                executor.mark_stopped(stop_reason(e))
                e.partial_result = _result(exp, executor, t0, feed.last_loss)
            raise
    finally:
        if writer is not None:
            writer.close()
        backend.shutdown()
    return _result(exp, executor, t0, feed.last_loss)


def _result(exp: Experiment, executor, t0: float, last_loss: Optional[float]) -> RunResult:
    return RunResult(exp, executor.report, executor.run_dir, executor.step_records,
                     time.perf_counter() - t0, last_loss)


def _tensorboard_writer(executor):
    """A ``SummaryWriter`` into the run's ``tensorboard`` folder, set as the executor's writer."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(executor.run_dir / "tensorboard"))
    executor.writer = writer
    return writer


class _ProgressFeed:
    """Calls ``progress(Progress)`` after every step, refreshing the figures that wait for the
    wafer (loss, buffer fill, rate) every ``every_s`` seconds, on the first and last steps, and
    on the steps ``progress.wants(step)`` asks for."""

    def __init__(self, progress: Optional[Callable], every_s: float):
        self.progress, self.every_s = progress, every_s
        self.wants = getattr(progress, "wants", None)
        self.last_show = 0.0
        self.last_loss: Optional[float] = None
        self.loss_step: Optional[int] = None
        self.rate: Optional[float] = None
        self.fill: Optional[float] = None

    def after_step(self, executor, i: int, loss) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if (i == 0 or now - self.last_show >= self.every_s or i == executor.num_steps - 1
                or (self.wants is not None and self.wants(i + 1))):
            self.last_show = now
            self._refresh(executor, i, loss)
        self.progress(Progress(i + 1, executor.num_steps, self.last_loss, self.rate, self.fill,
                               self.loss_step))

    def _refresh(self, executor, i: int, loss) -> None:
        from executor.phases import phase

        run = executor.run
        if run.has_wafer:
            if i == 0:
                with phase("first batch through the wafer"):
                    stats = run.progress_stats(i)
            else:
                stats = run.progress_stats(i)
            self.fill = None if stats is None else stats.get("buffer_occupancy")
        if loss is not None:
            self.last_loss, self.loss_step = float(loss.item()), i + 1
        self.rate = _progress_rate(executor, i)


def _progress_rate(executor, i: int) -> Optional[float]:
    """samples/s for the progress display: the wafer's over its last 10 steps where there is a
    wafer (the client runs ahead of it, so its own rate can exceed what the wafer does), else
    the client's smoothed rate."""
    from executor.report import wafer_rate

    stats = executor.run.wafer_stats()
    if stats is not None:
        return wafer_rate(stats)
    return executor.profiler.rate() if i > 0 else None


def _training_step(exp: Experiment, backend, artifact_dir: Path):
    """The traced training step of ``exp.model`` (None, None for ``model: null``)."""
    import cstream

    if exp.model is None:
        return None, None
    with backend.device:
        model = exp.model.build()
    compiled = cstream.compile(model, backend)
    optimizer, scheduler = _configure(exp.optimizer, exp.learning_rate, model.parameters())
    loss_fn = LOSSES[exp.model.loss]

    @cstream.trace
    def training_step(batch):
        inputs, targets = _split_batch(batch)
        loss = loss_fn(compiled(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        cstream.summarize_scalar("loss", loss)  # TensorBoard, every step
        return loss

    save = None
    if exp.checkpoint_steps is not None:
        ckpt_dir = artifact_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)

        @cstream.checkpoint_closure
        def save(step):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "global_step": step}
            if scheduler is not None:
                state["lr_scheduler"] = scheduler.state_dict()
            cstream.save(state, ckpt_dir / f"checkpoint_{step}.mdl")

    return training_step, save
