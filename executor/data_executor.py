"""DataExecutor: drives a run -- steps, closures, checkpoint schedule and profiling."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

from executor import phases, runtime
from executor.profiler import Profiler
from executor.report_writers import StepScalars
from executor.schedule import Schedule, normalize_checkpoint_steps
from workers.checks import did_you_mean, positive_int
from workers.config import CSConfig
from workers.dataloader import STATE_FORMAT, DataLoader
from workers.errors import InputWorkerError

if TYPE_CHECKING:
    from executor.backends.base import Run

_PARAMS = (
    "dataloader", "num_steps", "checkpoint_steps", "cs_config", "writer", "profiler_activities",
    "activation_steps", "listeners", "micro_batch_size",
)


def _check_arguments(unknown: dict, dataloader) -> None:
    """Refuse a keyword DataExecutor does not take, and a dataloader that is not cstream's."""
    if unknown:
        name = next(iter(unknown))
        raise TypeError(
            f"DataExecutor got an unexpected keyword argument {name!r}."
            f"{did_you_mean(name, _PARAMS)} "
            f"Valid arguments: {', '.join(_PARAMS)}."
        )
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"DataExecutor expects a cstream.utils.data.DataLoader, got "
            f"{type(dataloader).__name__}. Wrap the function that builds your dataloader: "
            "cstream.utils.data.DataLoader(input_fn, ...), so that every input worker can "
            "build its own."
        )


def _num_steps(num_steps: Optional[int], dataloader: DataLoader, backend) -> int:
    """The steps the run takes: ``num_steps``, else ``len(dataloader)``; 1 on a backend that
    runs a single step (``compile_only``, ``validate_only``)."""
    forced = backend is not None and backend.forces_single_step
    if num_steps is None:
        if forced:
            num_steps = 1
        elif not dataloader.has_len():
            raise ValueError(
                f"num_steps was not given and the dataloader built by "
                f"{dataloader.input_fn_name} has no len(); pass num_steps=... to DataExecutor."
            )
        else:
            num_steps = len(dataloader)
    if isinstance(num_steps, bool) or not isinstance(num_steps, int):
        raise TypeError(f"num_steps: expected an int, got {type(num_steps).__name__}.")
    positive_int(num_steps, "num_steps", fix="Pass num_steps=1 or more" + (
        " (len(dataloader) is 0: the dataloader yields no batch)." if num_steps == 0 else "."))
    return 1 if forced else num_steps


def batch_size_of(batch) -> int:
    """Number of samples in a (nested) batch: the leading dimension of its first tensor."""
    import torch

    stack = [batch]
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            return int(item.shape[0]) if item.dim() > 0 else 1
        if isinstance(item, dict):
            stack[:0] = list(item.values())
        elif isinstance(item, (list, tuple)):
            stack[:0] = list(item)
        elif hasattr(item, "samples"):  # a lazy batch placeholder
            return int(item.samples)
    return 1


class QueuedClosure(NamedTuple):
    """A closure called during a step, run when the step ends."""

    fn: Callable
    args: tuple
    kwargs: dict
    checkpoint: bool = False
    """A checkpoint closure (reads state at its step, runs only on checkpoint steps); else a
    step closure (its tensor arguments are read when it runs)."""

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    @property
    def kind(self) -> str:
        return "checkpoint closure" if self.checkpoint else "step closure"


class ClosureQueue:
    """The closures called during the current step, in call order; the executor runs and
    empties it when the step ends.

    >>> q = ClosureQueue()
    >>> q.add(print, ("a",), {}, checkpoint=True)
    >>> mark = q.mark()
    >>> q.add(print, ("b",), {})
    >>> [c.args for c in q.take_since(mark)], len(q)
    ([('b',)], 1)
    """

    def __init__(self):
        self._entries: list[QueuedClosure] = []

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, fn: Callable, args, kwargs, checkpoint: bool = False) -> None:
        self._entries.append(QueuedClosure(fn, args, kwargs, checkpoint))

    def mark(self) -> int:
        """A position to :meth:`take_since` from: the closures queued after this call (it
        holds until the queue is next emptied or filtered)."""
        return len(self._entries)

    def take_since(self, mark: int) -> list[QueuedClosure]:
        """Remove and return the closures queued since ``mark`` (from :meth:`mark`)."""
        taken = self._entries[mark:]
        del self._entries[mark:]
        return taken

    def take_all(self) -> list[QueuedClosure]:
        """Remove and return every queued closure."""
        return self.take_since(0)

    def drop_step_closures(self) -> None:
        """Forget the queued step closures, keeping the checkpoint closures (a run where
        nothing executes has no values for step closures to read)."""
        self._entries = [c for c in self._entries if c.checkpoint]


def add_wafer_figures(records: list[dict], wafer_stats: Optional[dict]) -> None:
    """Each step record gets the wafer's figures of its step (a run on a wafer)."""
    for record in records if wafer_stats else []:
        stats = wafer_stats.get(record["step"])
        if stats is not None:
            record.update({k: v for k, v in stats.items() if k != "step"})


class DataExecutor:
    """Run ``num_steps`` steps over a cstream :class:`DataLoader`.

    Iterate it once: each iteration yields the step's batch, and at the end of the iteration the
    step closures queued during it run with materialised tensors.

    Args:
        dataloader: a :class:`cstream.utils.data.DataLoader`.
        num_steps: steps to run; defaults to ``len(dataloader)`` where known. The dataloader is
            cycled (new epochs) when it is shorter.
        checkpoint_steps: an int N (checkpoint every N steps and on the final step; 0 for
            none), a :class:`Schedule` of 0-based iterations (exactly those), or None for none.
        cs_config: a :class:`cstream.utils.CSConfig`.
        writer: a ``torch.utils.tensorboard.SummaryWriter``; receives every step, once the
            wafer has reported it, ``rate``, ``global_rate``, the wafer's and every input
            worker's figures (:class:`executor.report_writers.StepScalars`) and what the step writes
            with ``cstream.summarize_scalar``; the run summary at the end.
        profiler_activities: subset of ``["rate", "global_rate"]`` (both by default).
        activation_steps: the Cerebras API's interval for fetching activations (outputs of
            non-closure tensors) from the system; every step's outputs are available in
            cstream, so it has no effect. Recorded in the run's profile.
        listeners: ``cerebras.pytorch.experimental.listener`` objects (tensor listeners that
            the Cerebras compiler attaches to the graph); cstream attaches none and calls none,
            so they have no effect. Recorded in the run's profile by their class names.
        micro_batch_size: the Cerebras API's per-CS-X gradient-accumulation micro-batch
            (``"auto"``, ``"explore"``, None, an int or a per-mode dict); the simulated wafer
            runs each CS-X's batch whole, so it has no effect on the numbers. Recorded in the
            run's profile.

    >>> import torch, cstream
    >>> _ = cstream.backend("CPU")
    >>> loader = cstream.utils.data.DataLoader(lambda: [torch.zeros(4, 2)] * 3)
    >>> executor = cstream.utils.data.DataExecutor(loader, num_steps=5, checkpoint_steps=2)
    >>> [executor.on_checkpoint_step for _ in executor]
    [False, True, False, True, True]
    >>> cstream.current_backend().shutdown()
    """

    def __init__(self, dataloader: DataLoader = None, num_steps: Optional[int] = None,
                 checkpoint_steps=None, cs_config: Optional[CSConfig] = None, writer=None,
                 profiler_activities=None, activation_steps: Optional[int] = None,
                 listeners=(), micro_batch_size="auto", **unknown: Any):
        _check_arguments(unknown, dataloader)
        if cs_config is None:
            # Release 2.3 on: the layout is the CSX backend's cluster_config
            cluster = getattr(getattr(runtime.current_backend(), "cluster", None), "config", None)
            cs_config = CSConfig(**{k: getattr(cluster, k) for k in ("num_csx",
                                                                   "num_workers_per_csx")}
                                 if cluster is not None else {})
        if not isinstance(cs_config, CSConfig):
            raise TypeError(
                f"cs_config: expected cstream.utils.CSConfig, got {type(cs_config).__name__}."
            )
        self.dataloader = dataloader
        self.cs_config = cs_config
        self.writer = writer
        self.accepted_without_effect = {
            k: v for k, v in (("activation_steps", activation_steps),
                              ("listeners", [type(x).__name__ for x in listeners or ()]),
                              ("micro_batch_size", micro_batch_size)) if v not in (None, [])}
        self.profiler = Profiler(profiler_activities)
        # unix time (the wafer's step ends) to the profiler's clock, one offset for the run so
        # that intervals between the wafer's times stay exact
        self._perf_minus_unix = time.perf_counter() - time.time()
        self.checkpoint_steps = checkpoint_steps
        self.num_steps = _num_steps(num_steps, dataloader, runtime.current_backend())
        self.checkpoint_schedule: Schedule = normalize_checkpoint_steps(checkpoint_steps,
                                                                        self.num_steps)
        self._init_run_state()

    def _init_run_state(self) -> None:
        """What the run fills in as it goes: the step, the closure queue, the records."""
        self.iteration = -1
        self._iterated = False
        self.closures = ClosureQueue()
        """The closures called during the current step (``cstream.step_closure``,
        ``cstream.checkpoint_closure``), run when it ends."""
        self._run: Optional[Run] = None
        self.run_dir: Optional[Path] = None
        self.step_records: list[dict] = []
        self.summary: dict = {}
        self.report: dict = {}
        self.name: Optional[str] = None
        """The run's name in reports and plot titles (``run_experiment`` sets the
        experiment's name)."""
        self.stop_reason: Optional[str] = None
        """Why the run ended before its last step (None while it has not)."""
        self.client_spans: list[dict] = []
        self._stopped_in_body = False
        self._step_start_unix = 0.0
        self._scalars = StepScalars(self.cs_config)

    # -- step bookkeeping ----------------------------------------------------------------
    @property
    def artifact_dir(self) -> Path:
        """This run's directory (``<backend artifact_dir>/executors/<n>``), made when the
        executor is iterated: the Cerebras API's name for :attr:`run_dir`."""
        if self.run_dir is None:
            raise RuntimeError("DataExecutor must be iterated before having an artifact directory.")
        return self.run_dir

    @property
    def user_iteration(self) -> int:
        """The current step counted from 1 (the global step of the run)."""
        return self.iteration + 1

    @property
    def on_final_iteration(self) -> bool:
        return self.iteration == self.num_steps - 1

    def is_checkpoint_step(self, iteration: int) -> bool:
        return self.checkpoint_schedule.match(iteration)

    @property
    def on_checkpoint_step(self) -> bool:
        return self.iteration >= 0 and self.is_checkpoint_step(self.iteration)

    def checkpoint_iterations(self) -> list[int]:
        return [i for i in range(self.num_steps) if self.is_checkpoint_step(i)]

    def queue_closure(self, fn: Callable, args, kwargs, checkpoint: bool = False) -> None:
        """Run ``fn(*args, **kwargs)`` when the current step ends."""
        self.closures.add(fn, args, kwargs, checkpoint)

    @property
    def run(self) -> Optional[Run]:
        """The backend's run of this executor while it is iterated (None before and after)."""
        return self._run

    # -- the run -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self):
        if self._iterated:
            raise RuntimeError(
                "this DataExecutor has already been iterated; an executor runs once. Create a "
                "new DataExecutor for another run."
            )
        self._iterated = True
        backend = runtime.current_backend(required=True)
        if runtime.current_executor() is not None:
            raise RuntimeError(
                "another DataExecutor is being iterated; finish it before starting a new one."
            )
        self._make_run_dir(backend)
        runtime.set_executor(self)
        self.dataloader.bind_state_provider(self._dataloader_state)
        t0 = time.perf_counter()
        ok = False
        try:
            self._run_initial_closures(backend)
            from executor.backends.base import RunContext

            self._run = backend.start_run(RunContext(
                dataloader=self.dataloader, cs_config=self.cs_config, num_steps=self.num_steps,
                checkpoint_steps=frozenset(self.checkpoint_iterations()),
                closures=self.closures, iteration=lambda: self.iteration))
            self.profiler.time_steps_by(_wafer_end_lookup(self._run, self._perf_minus_unix))
            for step in range(self.num_steps):
                self.iteration = step
                self._step_start_unix = time.time()
                batch = self._run.next_batch(step)
                try:
                    yield batch
                except GeneratorExit:
                    # the loop stopped inside its body (break, an exception, Ctrl-C): keep the
                    # step's closures and say so in the profile
                    self._stopped_in_body = True
                    self.stop_reason = self.stop_reason or (
                        f"the loop over the executor stopped during step {step + 1} (break, "
                        "an exception in the loop body, or Ctrl-C)")
                    self._end_step(step)
                    raise
                self._end_step(step)
            ok = True
        except GeneratorExit:
            raise
        except InputWorkerError as e:
            self.stop_reason = self.stop_reason or stop_reason(e)
            # the input_fn's failure as the worker reported it, with the traceback of this
            # run's machinery left out: the user's loop, then this line
            raise e.with_traceback(None)  # noqa: B904 (its __cause__ is kept)
        except BaseException as e:
            self.stop_reason = self.stop_reason or stop_reason(e)
            raise
        finally:
            self.closures.take_all()
            run, self._run = self._run, None
            try:
                if run is not None:
                    self.summary = run.close(ok) or {}
                    add_wafer_figures(self.step_records, run.wafer_stats())
            finally:
                self.profiler.finish(self._last_step_ran())
                runtime.set_executor(None)
                self.dataloader.bind_state_provider(None)
                self.summary.setdefault("wall_s", time.perf_counter() - t0)
                self._write_profile(completed=ok)

    def _last_step_ran(self) -> Optional[float]:
        """When the wafer ended the last step, on the profiler's clock (None: no wafer figure;
        the client queues steps ahead of the wafer, which ends them later)."""
        end_unix = self.step_records[-1].get("end_unix") if self.step_records else None
        return None if end_unix is None else end_unix + self._perf_minus_unix

    def _run_initial_closures(self, backend) -> None:
        """Checkpoint closures called before this run: they run now, before the first step,
        with the initial values (nothing streams yet, so every state tensor is readable)."""
        closures, backend.initial_closures = backend.initial_closures, []
        for fn, args, kwargs in closures:
            t0 = time.time()
            fn(*args, **kwargs)
            self._record_span(QueuedClosure(fn, args, kwargs, checkpoint=True), 0, t0)

    def _record_span(self, closure: QueuedClosure, step: int, t0: float) -> None:
        """The client's time in ``closure`` of ``step`` (counted from 1; 0: before the run),
        from ``t0`` (unix seconds) to now, for the run's timeline."""
        self.client_spans.append({"name": closure.name, "step": step, "kind": closure.kind,
                                  "start_unix": t0, "end_unix": time.time()})

    def _dataloader_state(self) -> dict:
        """What ``DataLoader.state_dict()`` returns during this run: every worker's position
        after the current step (only on a checkpoint step, inside a checkpoint closure); in a
        checkpoint closure called before the run, where the run will start (the state loaded
        with ``load_state_dict``, or no worker state: the start)."""
        if self._run is None and self.iteration == -1 and runtime.current_executor() is self:
            loaded = self.dataloader.resume_state
            return dict(loaded) if loaded is not None else {
                "format": STATE_FORMAT, "num_csx": self.cs_config.num_csx,
                "num_workers_per_csx": self.cs_config.num_workers_per_csx,
                "appliance_step": 0, "workers": []}
        if self._run is None or not self.on_checkpoint_step:
            raise RuntimeError(
                "DataLoader.state_dict() reads the workers' positions at a checkpoint step: call "
                "it inside a @cstream.checkpoint_closure during the run."
            )
        states = self._run.worker_states(self.iteration)
        out = {
            "format": STATE_FORMAT,
            "num_csx": self.cs_config.num_csx,
            "num_workers_per_csx": self.cs_config.num_workers_per_csx,
            "appliance_step": self.user_iteration,
            "workers": [dataclasses.asdict(s) for s in states],
        }
        autoscale = self._run.autoscale_state(self.iteration)
        if autoscale is not None:  # the counts at this step are the workers' states' own
            out["autoscale"] = autoscale
            out["num_workers_per_csx"] = max((s.num_workers_per_csx for s in states),
                                             default=self.cs_config.num_workers_per_csx)
        return out

    def _end_step(self, step: int) -> None:
        run = self._run
        metrics = run.end_step(step) or {}
        samples = metrics.pop("samples", None)
        if samples is None:
            samples = run.samples_in_step(step)
        self.profiler.step_done(samples)  # before the step's closures, which may read rates
        for closure in self.closures.take_all():
            t0 = time.time()
            if closure.checkpoint:
                with run.checkpoint_reads(step):
                    closure.fn(*closure.args, **closure.kwargs)
            else:
                margs, mkwargs = run.materialize((closure.args, closure.kwargs), step)
                with run.closure_reads(step):
                    closure.fn(*margs, **mkwargs)
            self._record_span(closure, step + 1, t0)
        run.step_done(step)
        if self.dataloader.batch_size is None:
            self.dataloader.batch_size = samples
        record = {"step": step + 1, "samples": samples, "time": time.perf_counter(),
                  "client_start_unix": self._step_start_unix, "client_end_unix": time.time(),
                  **metrics}
        self.step_records.append(record)
        if self.writer is not None:
            self._scalars.write_ready(self.writer, self.step_records, run.wafer_stats())

    # -- artifacts -----------------------------------------------------------------------
    def _make_run_dir(self, backend) -> None:
        self.run_dir = new_run_dir(Path(backend.artifact_dir) / "executors")

    def _write_profile(self, completed: bool) -> None:
        if self.run_dir is None:
            return
        t_first = self.profiler.first_step_end
        steps = [
            {**r, "time": (r["time"] - t_first) if t_first is not None else 0.0}
            for r in self.step_records
        ]
        startup = self.summary.setdefault("startup", {})
        if t_first is not None and "time_to_first_step_s" not in startup:
            run_start = time.perf_counter() - self.summary["wall_s"]
            startup["time_to_first_step_s"] = t_first - run_start
        profile = {
            "num_steps": self.num_steps,
            "steps_run": len(self.step_records),
            "cs_config": self.cs_config.to_dict(),
            "total_samples": self.profiler.samples,
            "accepted_without_effect": {
                **getattr(runtime.current_backend(), "accepted_without_effect", {}),
                **self.accepted_without_effect},
            "global_rate": self.profiler.global_rate_at_end(),
            "summary": self.summary,
            "steps": steps,
            "phases": phases.take(),
            "machine_cpus": _machine_cpus(),
            "client_spans": self.client_spans,
        }
        if not completed or len(steps) < self.num_steps:
            from executor.report import has_wafer_figures

            on_wafer = sum(1 for r in steps if has_wafer_figures(r))
            profile["interrupted"] = {
                "steps_run": on_wafer or len(steps), "num_steps": self.num_steps,
                "reason": self.stop_reason or "the run ended before its last step"}
        if self.name is not None:
            profile["name"] = self.name
        from executor import report, report_writers, timeline

        self.report = report.summarize_profile(profile)
        profile["report"] = self.report
        report_writers.write_profile(self.run_dir / "profile.json", profile)
        report_writers.write_steps_parquet(self.run_dir / "steps.parquet", steps)
        timeline.write_trace(self.run_dir / "trace.json", profile)
        if self.writer is not None:
            self._scalars.write_ready(self.writer, self.step_records, None, final=True)
            with report_writers.ctrl_c_after_block():
                report_writers.write_summary_scalars(self.writer, self.report,
                                             self.step_records[-1]["step"] if steps else 0)

    def mark_stopped(self, reason: str) -> None:
        """Say why the run stopped early when the loop body stopped it (an exception, Ctrl-C):
        the executor itself only saw the loop end. Updates ``report`` and ``profile.json``; a
        no-op for a run that completed or that stopped inside the executor (which knows why)."""
        if not self._stopped_in_body:
            return
        self.stop_reason = reason
        if self.report.get("interrupted"):
            self.report["interrupted"]["reason"] = reason
        path = self.run_dir / "profile.json" if self.run_dir is not None else None
        if path is None or not path.is_file():
            return
        profile = json.loads(path.read_text())
        if "interrupted" not in profile:
            return
        profile["interrupted"]["reason"] = reason
        profile["report"]["interrupted"] = profile["interrupted"]
        from executor import report_writers

        report_writers.write_profile(path, profile)


def new_run_dir(root: Path) -> Path:
    """A new numbered folder for a run under ``root`` (``000001``, ``000002``, ...; taken
    atomically, so runs started together get their own), with ``root/latest`` pointing at it."""
    root.mkdir(parents=True, exist_ok=True)
    existing = [int(p.name) for p in root.iterdir() if p.name.isdigit()]
    n = max(existing, default=0) + 1
    while True:
        run_dir = root / f"{n:06d}"
        try:
            run_dir.mkdir()
            break
        except FileExistsError:
            n += 1
    latest = root / "latest"
    tmp = root / f".latest.{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError:  # a file system without symbolic links: no "latest"
        pass
    return run_dir


def _wafer_end_lookup(run, perf_minus_unix: float):
    """The profiler's lookup of the newest step in ``(after, step]`` (counted from 1) the wafer
    is known to have ended, and when, on the profiler's clock (unix time + ``perf_minus_unix``),
    from the figures that came back so far; None where the run has no wafer. It looks from the
    newest step the figures hold down, so a query costs the steps between, not the run's."""
    if run.wafer_stats() is None:
        return None
    seen = [0, 0]  # figures looked at so far (in arrival order), the newest step among them

    def wafer_ends(step: int, after: int) -> Optional[tuple[int, float]]:
        stats = run.wafer_stats()
        if len(stats) > seen[0]:
            seen[1] = max(seen[1], *itertools.islice(stats, seen[0], None))
            seen[0] = len(stats)
        for k in range(min(step, seen[1]), after, -1):
            end_unix = (stats.get(k) or {}).get("end_unix")
            if end_unix is not None:
                return k, end_unix + perf_minus_unix
        return None

    return wafer_ends


def _machine_cpus() -> int:
    """CPUs the input workers and the wafer share: the Ray cluster's when Ray runs, else this
    process's."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            return int(ray.cluster_resources().get("CPU", 0)) or os.cpu_count() or 1
        except Exception:  # a cluster that does not answer: this machine's
            pass
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def stop_reason(e: BaseException) -> str:
    """``Type: first line of the message`` of an exception that ended a run."""
    if isinstance(e, KeyboardInterrupt):
        return "KeyboardInterrupt (Ctrl-C)"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
