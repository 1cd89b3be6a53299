"""DataExecutor: drives a run -- steps, closures, checkpoint schedule and profiling."""

from __future__ import annotations

import difflib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

from executor import runtime
from executor.profiler import Profiler
from executor.schedule import Schedule, normalize_checkpoint_steps
from workers.config import CSConfig
from workers.dataloader import DataLoader

_PARAMS = (
    "dataloader", "num_steps", "checkpoint_steps", "cs_config", "writer", "profiler_activities",
)


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


class DataExecutor:
    """Run ``num_steps`` steps over a cstream :class:`DataLoader`.

    Iterate it once: each iteration yields the step's batch, and at the end of the iteration the
    step closures queued during it run with materialised tensors.

    Args:
        dataloader: a :class:`cstream.utils.data.DataLoader`.
        num_steps: steps to run; defaults to ``len(dataloader)`` where known. The dataloader is
            cycled (new epochs) when it is shorter.
        checkpoint_steps: an int N (checkpoint every N steps and always on the final step) or a
            :class:`Schedule`; None for no checkpoints.
        cs_config: a :class:`cstream.utils.CSConfig`.
        writer: a ``torch.utils.tensorboard.SummaryWriter``; receives ``rate``,
            ``global_rate`` and the wafer's figures every step.
        profiler_activities: subset of ``["rate", "global_rate"]`` (both by default).

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
                 profiler_activities=None, **unknown: Any):
        if unknown:
            name = next(iter(unknown))
            close = difflib.get_close_matches(name, _PARAMS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"DataExecutor got an unexpected keyword argument {name!r}.{hint} "
                f"Valid arguments: {', '.join(_PARAMS)}."
            )
        if not isinstance(dataloader, DataLoader):
            raise TypeError(
                f"DataExecutor expects a cstream.utils.data.DataLoader, got "
                f"{type(dataloader).__name__}. Wrap the function that builds your dataloader: "
                "cstream.utils.data.DataLoader(input_fn, ...), so that every input worker can "
                "build its own."
            )
        if cs_config is None:
            cs_config = CSConfig()
        if not isinstance(cs_config, CSConfig):
            raise TypeError(
                f"cs_config: expected cstream.utils.CSConfig, got {type(cs_config).__name__}."
            )
        self.dataloader = dataloader
        self.cs_config = cs_config
        self.writer = writer
        self.profiler = Profiler(profiler_activities)
        self.checkpoint_schedule: Optional[Schedule] = normalize_checkpoint_steps(checkpoint_steps)
        self.checkpoint_steps = checkpoint_steps
        backend = runtime.current_backend()
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
        if num_steps < 1:
            raise ValueError(
                f"num_steps must be at least 1, got {num_steps}"
                + (" (len(dataloader) is 0: the dataloader yields no batch)" if num_steps == 0 else "")
                + "."
            )
        self.num_steps = 1 if forced else num_steps
        self.iteration = -1
        self._iterated = False
        self._closures: list = []
        self._run = None
        self.run_dir: Optional[Path] = None
        self.step_records: list[dict] = []
        self.summary: dict = {}
        self.report: dict = {}

    # -- step bookkeeping ----------------------------------------------------------------
    @property
    def user_iteration(self) -> int:
        """The current step counted from 1 (the global step of the run)."""
        return self.iteration + 1

    @property
    def on_final_iteration(self) -> bool:
        return self.iteration == self.num_steps - 1

    def is_checkpoint_step(self, iteration: int) -> bool:
        if self.checkpoint_schedule is None:
            return False
        step = iteration + 1
        return step == self.num_steps or self.checkpoint_schedule.contains(step, self.num_steps)

    @property
    def on_checkpoint_step(self) -> bool:
        return self.iteration >= 0 and self.is_checkpoint_step(self.iteration)

    def checkpoint_iterations(self) -> list[int]:
        return [i for i in range(self.num_steps) if self.is_checkpoint_step(i)]

    def queue_closure(self, fn: Callable, args, kwargs, checkpoint: bool = False) -> None:
        self._closures.append((fn, args, kwargs, checkpoint))

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
        t0 = time.perf_counter()
        ok = False
        try:
            self._run = backend.start_run(self)
            for step in range(self.num_steps):
                self.iteration = step
                batch = self._run.next_batch(step)
                try:
                    yield batch
                except GeneratorExit:
                    self._end_step(step)  # the loop body finished (break): keep its closures
                    raise
                self._end_step(step)
            ok = True
        finally:
            self._closures.clear()
            run, self._run = self._run, None
            try:
                if run is not None:
                    self.summary = run.close(ok) or {}
            finally:
                runtime.set_executor(None)
                self.summary.setdefault("wall_s", time.perf_counter() - t0)
                self._write_profile()

    def _end_step(self, step: int) -> None:
        run = self._run
        metrics = run.end_step(step) or {}
        closures, self._closures = self._closures, []
        for fn, args, kwargs, checkpoint in closures:
            if checkpoint:
                with run.checkpoint_reads(step):
                    fn(*args, **kwargs)
            else:
                margs, mkwargs = run.materialize((args, kwargs), step)
                with run.closure_reads(step):
                    fn(*margs, **mkwargs)
        run.step_done(step)
        samples = metrics.pop("samples", None)
        if samples is None:
            samples = run.samples_in_step(step)
        self.profiler.step_done(samples)
        record = {"step": step + 1, "samples": samples, "time": time.perf_counter(), **metrics}
        self.step_records.append(record)
        if self.writer is not None:
            rate, grate = self.profiler._log_rates()
            self.writer.add_scalar("rate", rate, step + 1)
            self.writer.add_scalar("global_rate", grate, step + 1)
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.writer.add_scalar(f"wafer/{k}", v, step + 1)

    # -- artifacts -----------------------------------------------------------------------
    def _make_run_dir(self, backend) -> None:
        root = Path(backend.artifact_dir) / "executors"
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
        self.run_dir = run_dir
        latest = root / "latest"
        tmp = root / f".latest.{os.getpid()}"
        try:
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(run_dir.name)
            os.replace(tmp, latest)
        except OSError:
            pass

    def _write_profile(self) -> None:
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
            "total_samples": self.profiler.total_samples,
            "global_rate": (
                self.profiler.total_samples / (self.profiler.last_step_end - t_first)
                if t_first is not None and self.profiler.last_step_end > t_first else 0.0
            ),
            "summary": self.summary,
            "steps": steps,
        }
        from executor import report

        self.report = report.summarize_profile(profile)
        profile["report"] = self.report
        tmp = self.run_dir / "profile.json.tmp"
        tmp.write_text(json.dumps(profile, indent=1, default=float))
        os.replace(tmp, self.run_dir / "profile.json")
        report.write_steps_parquet(self.run_dir / "steps.parquet", steps)
        if self.writer is not None:
            report.write_scalars(self.writer, steps, self.report)
