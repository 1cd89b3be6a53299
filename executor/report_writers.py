"""Where a run's figures are written: a TensorBoard writer (:class:`StepScalars` every step,
:func:`write_summary_scalars` at the end) and the run directory (``steps.parquet``, and
:func:`load_run` reading ``profile.json`` back). The figures come from :mod:`executor.report`."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
from collections import deque
from pathlib import Path
from typing import Optional

from executor.report import SUMMARY_SCALARS, has_wafer_figures, step_rows


class StepScalars:
    """Writes every step's scalars to a ``SummaryWriter`` as soon as the step's figures are
    known, in step order:

    * ``rate`` -- samples/s over the last ``window`` steps; ``global_rate`` -- samples/s from the
      start of the first step. Both on the wafer's clock (the step ends the wafer recorded) on
      CSX, on the client's elsewhere; every window holds whole steps, so no figure comes from a
      window of nearly zero length;
    * ``wafer/<name>`` -- the wafer's figures of the step (:data:`executor.report.STEP_SCALARS`);
    * ``workers/csx<c>_w<w>/batches_per_s`` for every input worker (batches it delivered in the
      window), and ``workers/csx<c>_w<w>/produce_ms`` for the worker that produced the step's
      batch (its own production time);
    * ``workers/csx<c>_count`` in an autoscaled run: the CS-X's input workers at that step.
    """

    def __init__(self, cs_config=None, window: int = 10):
        self.window = window
        self.workers = ([(c, w) for c in range(cs_config.num_csx)
                         for w in range(cs_config.num_workers_per_csx)] if cs_config else [])
        self.written = 0
        self._clock = None
        self._t0 = None
        self._total = 0
        self._prev_end = None
        self._ends: deque = deque(maxlen=window + 1)
        self._samples: deque = deque(maxlen=window)
        self._delivered: deque = deque(maxlen=window)

    def write_ready(self, writer, records: list[dict], wafer_stats: Optional[dict],
                    final: bool = False) -> None:
        """Write the steps of ``records`` not written yet. ``wafer_stats`` (step -> the wafer's
        figures, CSX) holds back a step until its figures arrived, unless ``final``."""
        while self.written < len(records):
            r = records[self.written]
            if wafer_stats is not None and not final:
                stats = wafer_stats.get(r["step"])
                if stats is None:
                    break
                r.update({k: v for k, v in stats.items() if k != "step"})
            with ctrl_c_after_block():
                self._write(writer, r)
            self.written += 1
        if final:
            with ctrl_c_after_block():
                writer.flush()

    def _span(self, r: dict):
        if has_wafer_figures(r):
            end = r["wafer_t"]
            return "wafer", end - r["compute_s"] - r.get("input_wait_s", 0.0), end
        if "client_start_unix" in r and "client_end_unix" in r:
            return "client", r["client_start_unix"], r["client_end_unix"]
        return None, None, None

    def _write(self, writer, r: dict) -> None:
        step = r["step"]
        clock, start, end = self._span(r)
        if clock is None or (self._clock is not None and clock != self._clock):
            return  # no times on the run's clock (a step the wafer never reported)
        if self._clock is None:
            self._clock, self._t0 = clock, start
            self._ends.append(start)
            self._prev_end = start
        samples = int(r.get("samples", 0))
        self._total += samples
        self._ends.append(end)
        self._samples.append(samples)
        delivered = [(c, int(w)) for c, w in enumerate(r.get("workers") or [])]
        self._delivered.append(delivered)
        span = end - self._ends[0]
        if span > 0:
            writer.add_scalar("rate", sum(self._samples) / span, step)
        if end > self._t0:
            writer.add_scalar("global_rate", self._total / (end - self._t0), step)
        if clock == "wafer":
            wall = end - self._prev_end
            figures = {"compute_s": r["compute_s"], "input_wait_s": r.get("input_wait_s", 0.0),
                       "buffer_occupancy": r.get("buffer_occupancy"), "step_wall_s": wall,
                       "utilisation": r["compute_s"] / wall if wall > 0 else 1.0,
                       "device_idle_s": r.get("device_idle_s")}
            for key, v in figures.items():
                if v is not None:
                    writer.add_scalar(f"wafer/{key}", float(v), step)
        self._prev_end = end
        for c, n in enumerate(r.get("num_workers") or []):
            writer.add_scalar(f"workers/csx{c}_count", n, step)
        if delivered and span > 0:
            counts: dict = {}
            for d in self._delivered:
                for cw in d:
                    counts[cw] = counts.get(cw, 0) + 1
            for c, w in sorted(set(self.workers) | set(counts)):
                writer.add_scalar(f"workers/csx{c}_w{w}/batches_per_s",
                                  counts.get((c, w), 0) / span, step)
        starts, ends = r.get("produce_start_unix"), r.get("produce_end_unix")
        if starts and ends:
            for c, w in delivered:
                writer.add_scalar(f"workers/csx{c}_w{w}/produce_ms",
                                  1000.0 * (ends[c] - starts[c]), step)


@contextlib.contextmanager
def ctrl_c_after_block():
    """Run the block whole: a Ctrl-C (SIGINT) that arrives inside it is raised as
    ``KeyboardInterrupt`` when the block ends. TensorBoard's writer takes a lock for each
    scalar; an interrupt raised inside it leaves the lock held, and the run's clean-up, which
    writes the summary, would then wait for that lock for ever. Only in the main thread, and
    only while Python's own SIGINT handler is installed (a program's own handler is left
    alone)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def write_summary_scalars(writer, report: dict, step: int) -> int:
    """Write the run summary (``summary/<name>``) and each worker's totals
    (``workers/csx<c>_w<w>/produce_batches_per_s``, ``.../input_wait_s``) at ``step`` (the last
    step). Returns the number of scalars written."""
    n = 0
    for key in SUMMARY_SCALARS:
        v = report.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            writer.add_scalar(f"summary/{key}", float(v), step)
            n += 1
    for w in report.get("workers", []):
        tag = f"workers/csx{w['csx']}_w{w['worker']}"
        writer.add_scalar(f"{tag}/input_wait_s", w["input_wait_s"], step)
        n += 1
        if w.get("produce_batches_per_s") is not None:
            writer.add_scalar(f"{tag}/produce_batches_per_s", w["produce_batches_per_s"], step)
            n += 1
    writer.flush()
    return n


# -- files -----------------------------------------------------------------------------------------
def write_profile(path: Path, profile: dict) -> None:
    """Write ``profile`` as ``path`` (``profile.json``) atomically: a reader sees the old file
    or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(profile, indent=1, default=float))
    os.replace(tmp, path)


def write_steps_parquet(path: Path, records: list[dict]) -> None:
    """One row per step (lists, such as the per-CS-X worker ids, stay list columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = step_rows(records)
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    table = pa.table({k: [r.get(k) for r in rows] for k in keys}) if rows else pa.table({})
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def load_run(run_dir) -> dict:
    """The ``profile.json`` of a run directory (``artifact_dir/executors/NNNNNN`` or its
    ``latest`` link), with a clear error when it is not one."""
    run_dir = Path(run_dir)
    path = run_dir / "profile.json"
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory. Give a run directory such "
                                "as cstream_logs/executors/000001 (or .../executors/latest).")
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} holds no profile.json, so it is not a run directory (a run writes "
            "artifact_dir/executors/NNNNNN/profile.json when its DataExecutor finishes).")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); the run may have been cut off "
                         "while writing it.") from None


