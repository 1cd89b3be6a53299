"""Run summaries computed from the per-step records of a DataExecutor run.

The wafer driver records, for every step: ``compute_s`` (the step's compute, held for at least the
simulated wafer's step time), ``input_wait_s`` (time the wafer waited for the step's batch),
``buffer_occupancy`` (batches ready in the input buffer when the step began), ``wafer_t`` (the end
of the step, seconds since the wafer started), ``workers`` (the input worker of each CS-X that
delivered the batch). From those this module derives:

* ``wafer_wall_s``: from the start of the first step to the end of the last (wafer clock);
* ``warmup_steps`` / ``warmup_s``: the steps until every input worker delivered its first batch
  (worker start-up); the steady-state figures below cover the steps after them
  (``steady_wall_s``), so a short run's start-up does not hide its steady rate;
* ``utilisation`` = compute / ``steady_wall_s``; ``starved_fraction`` = input wait /
  ``steady_wall_s``; the rest (``client_bound_fraction``) is time the wafer was held back by the
  client falling more than ``lookahead`` steps behind; ``utilisation_incl_warmup`` covers the
  whole run;
* ``samples_per_s``: steady-state samples/s on the wafer; ``global_rate``: the seed's
  client-side figure (all samples / time since the first step ended on the client);
* per input worker: batches, batches/s and the input wait spent on it; ``worker_rate_spread`` =
  (max - min) / mean of the per-worker batches/s;
* ``time_to_first_step_s``: from the start of the run to the end of the first step on the wafer
  (tracing, compile and start-up included), with ``trace_s`` and ``compile_s`` beside it.

The same figures go to a TensorBoard writer (:func:`write_scalars`) and to
``artifact_dir/executors/NNNNNN/`` (:func:`write_run_files`: ``profile.json`` with the summary,
``steps.parquet`` with one row per step).

>>> records = [
...     {"step": 1, "samples": 8, "compute_s": 0.01, "input_wait_s": 0.0, "wafer_t": 0.01,
...      "buffer_occupancy": 1.0, "workers": [0]},
...     {"step": 2, "samples": 8, "compute_s": 0.01, "input_wait_s": 0.01, "wafer_t": 0.03,
...      "buffer_occupancy": 0.0, "workers": [0]},
... ]
>>> s = summarize(records)
>>> s["warmup_steps"], round(s["utilisation"], 3), round(s["starved_fraction"], 3)
(1, 0.5, 0.5)
>>> round(s["samples_per_s"], 1), round(s["utilisation_incl_warmup"], 3)
(400.0, 0.667)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

#: summary keys written as TensorBoard scalars (under ``summary/``) and shown in tables
SUMMARY_SCALARS = (
    "samples_per_s", "global_rate", "utilisation", "starved_fraction", "client_bound_fraction",
    "mean_buffer_occupancy", "worker_rate_spread", "time_to_first_step_s", "wafer_wall_s",
    "utilisation_incl_warmup", "warmup_s", "trace_s", "compile_s",
)
#: per-step keys written as TensorBoard scalars (under ``wafer/``)
STEP_SCALARS = ("compute_s", "input_wait_s", "buffer_occupancy", "utilisation", "step_wall_s")


def has_wafer_figures(records: list[dict]) -> bool:
    """True when the records carry the wafer driver's per-step figures (CSX runs)."""
    return bool(records) and all("compute_s" in r and "wafer_t" in r for r in records)


def step_rows(records: list[dict]) -> list[dict]:
    """Per-step rows: the records plus ``step_wall_s`` (wafer time since the previous step ended)
    and the step's ``utilisation`` (compute / step wall). Rows without wafer figures pass
    through."""
    rows = []
    prev_end = None
    for r in sorted(records, key=lambda r: r["step"]):
        row = dict(r)
        if "compute_s" in r and "wafer_t" in r:
            start = r["wafer_t"] - r["compute_s"] - r.get("input_wait_s", 0.0)
            wall = r["wafer_t"] - (prev_end if prev_end is not None else start)
            row["step_wall_s"] = wall
            row["utilisation"] = r["compute_s"] / wall if wall > 0 else 1.0
            prev_end = r["wafer_t"]
        rows.append(row)
    return rows


def warmup_steps(records: list[dict]) -> int:
    """Steps until every input worker has delivered its first batch (worker start-up: actor
    start, ``input_fn``, the first batch's transfer). Steady-state figures leave them out."""
    seen: set = set()
    last_new = 0
    for i, r in enumerate(records, 1):
        for c, w in enumerate(r.get("workers") or []):
            if (c, w) not in seen:
                seen.add((c, w))
                last_new = i
    return last_new


def _whole_rounds(records: list[dict]) -> int:
    """The longest prefix of ``records`` made of whole round-robin rounds of every CS-X's
    workers, so that per-worker counts are not skewed by a round cut short."""
    per_csx = max((len(r.get("workers") or []) for r in records), default=0)
    widths = [1 + max((int(r["workers"][c]) for r in records if len(r.get("workers") or []) > c),
                      default=0) for c in range(per_csx)]
    period = max(widths, default=1)
    return (len(records) // period) * period


def _worker_figures(records: list[dict], wafer_wall_s: float) -> list[dict]:
    counts: dict[tuple[int, int], list] = {}
    for r in records:
        workers = r.get("workers") or []
        share = r.get("input_wait_s", 0.0) / max(len(workers), 1)
        for c, w in enumerate(workers):
            entry = counts.setdefault((c, int(w)), [0, 0.0])
            entry[0] += 1
            entry[1] += share
    out = []
    for (c, w), (batches, wait) in sorted(counts.items()):
        out.append({"csx": c, "worker": w, "batches": batches,
                    "batches_per_s": batches / wafer_wall_s if wafer_wall_s > 0 else 0.0,
                    "input_wait_s": wait})
    return out


def summarize(records: list[dict], *, global_rate: Optional[float] = None,
              wall_s: Optional[float] = None, startup: Optional[dict] = None,
              stream_stats: Optional[list] = None) -> dict:
    """The run's figures from its per-step records (see the module docstring).

    ``global_rate`` and ``wall_s`` are the client's figures; ``startup`` holds ``trace_s``,
    ``compile_s`` and ``time_to_first_step_s`` where known; ``stream_stats`` are the input
    streams' own reports (one per CS-X), kept for straggler and restart counts.
    """
    records = sorted(records, key=lambda r: r["step"])
    samples = sum(int(r.get("samples", 0)) for r in records)
    out: dict[str, Any] = {"steps": len(records), "samples": samples,
                           "global_rate": global_rate, "wall_s": wall_s}
    startup = startup or {}
    for key in ("time_to_first_step_s", "trace_s", "compile_s"):
        out[key] = startup.get(key)
    if not has_wafer_figures(records):
        for key in ("samples_per_s", "utilisation", "starved_fraction", "client_bound_fraction",
                    "mean_buffer_occupancy", "worker_rate_spread", "wafer_wall_s",
                    "utilisation_incl_warmup", "warmup_steps", "warmup_s"):
            out.setdefault(key, None)
        out["workers"] = []
        return out
    first = records[0]
    start = first["wafer_t"] - first["compute_s"] - first.get("input_wait_s", 0.0)
    wafer_wall = records[-1]["wafer_t"] - start
    warm = warmup_steps(records)
    if warm >= len(records):
        warm = 0  # too short to leave the warm-up out
    steady = records[warm:]
    steady_start = records[warm - 1]["wafer_t"] if warm else start
    wall = records[-1]["wafer_t"] - steady_start
    compute = sum(r["compute_s"] for r in steady)
    wait = sum(r.get("input_wait_s", 0.0) for r in steady)
    occupancy = [float(r.get("buffer_occupancy", 0.0)) for r in steady]
    workers = _worker_figures(steady[:_whole_rounds(steady)] or steady, wall)
    rates = [w["batches_per_s"] for w in workers]
    mean_rate = sum(rates) / len(rates) if rates else 0.0
    out.update({
        "wafer_wall_s": wafer_wall,
        "warmup_steps": warm,
        "warmup_s": steady_start - start,
        "steady_wall_s": wall,
        "compute_s": compute,
        "input_wait_s": wait,
        "samples_per_s": sum(int(r.get("samples", 0)) for r in steady) / wall if wall > 0 else 0.0,
        "utilisation": compute / wall if wall > 0 else 1.0,
        "starved_fraction": wait / wall if wall > 0 else 0.0,
        "client_bound_fraction": max(0.0, 1.0 - (compute + wait) / wall) if wall > 0 else 0.0,
        "utilisation_incl_warmup": (sum(r["compute_s"] for r in records) / wafer_wall
                                    if wafer_wall > 0 else 1.0),
        "mean_buffer_occupancy": sum(occupancy) / len(occupancy),
        "max_buffer_occupancy": max(occupancy),
        "worker_rate_spread": (max(rates) - min(rates)) / mean_rate if mean_rate > 0 else 0.0,
        "workers": workers,
    })
    if stream_stats:
        out["worker_restarts"] = sum(int(s.get("restarts", 0)) for s in stream_stats)
        out["straggler_reports"] = sum(len(s.get("stragglers", [])) for s in stream_stats)
    return out


def summarize_profile(profile: dict) -> dict:
    """:func:`summarize` applied to a ``profile.json`` document (as :func:`load_run` returns)."""
    summary = profile.get("summary", {})
    return summarize(profile.get("steps", []), global_rate=profile.get("global_rate"),
                     wall_s=summary.get("wall_s"), startup=summary.get("startup"),
                     stream_stats=summary.get("workers"))


# -- TensorBoard -----------------------------------------------------------------------------------
def write_scalars(writer, records: list[dict], report: dict) -> int:
    """Write the per-step wafer figures (``wafer/<name>``, at their step), the per-worker rates
    (``workers/csx<c>_w<w>/batches_per_s``) and the run summary (``summary/<name>``, at the
    last step) to a ``SummaryWriter``. Returns the number of scalars written."""
    n = 0
    rows = step_rows(records)
    for row in rows:
        for key in STEP_SCALARS:
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                writer.add_scalar(f"wafer/{key}", float(v), row["step"])
                n += 1
    last = rows[-1]["step"] if rows else 0
    for key in SUMMARY_SCALARS:
        v = report.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            writer.add_scalar(f"summary/{key}", float(v), last)
            n += 1
    for w in report.get("workers", []):
        writer.add_scalar(f"workers/csx{w['csx']}_w{w['worker']}/batches_per_s",
                          w["batches_per_s"], last)
        writer.add_scalar(f"workers/csx{w['csx']}_w{w['worker']}/input_wait_s",
                          w["input_wait_s"], last)
        n += 2
    writer.flush()
    return n


# -- files -----------------------------------------------------------------------------------------
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


# -- text ------------------------------------------------------------------------------------------
def pct(value: float) -> str:
    """A fraction as a percentage with one decimal, rounded down (so 94.98% never reads as a
    95% target reached)."""
    return f"{math.floor(1000 * value + 1e-9) / 10:.1f}%"


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if unit == "%":
            return pct(value)
        if unit == "s":
            return f"{value:.3f} s"
        return f"{value:,.1f}"
    return f"{value}{unit}"


SUMMARY_ROWS = (
    ("steps", "steps", ""),
    ("samples", "samples", ""),
    ("samples/s (wafer)", "samples_per_s", ""),
    ("global_rate (samples/s)", "global_rate", ""),
    ("wafer utilisation", "utilisation", "%"),
    ("input-starved", "starved_fraction", "%"),
    ("client-bound", "client_bound_fraction", "%"),
    ("mean input-buffer occupancy", "mean_buffer_occupancy", ""),
    ("worker batches/s spread", "worker_rate_spread", "%"),
    ("time to first step", "time_to_first_step_s", "s"),
    ("  tracing", "trace_s", "s"),
    ("  compile", "compile_s", "s"),
    ("utilisation incl. warm-up", "utilisation_incl_warmup", "%"),
    ("warm-up steps (worker start-up)", "warmup_steps", ""),
    ("warm-up time", "warmup_s", "s"),
    ("wafer wall time", "wafer_wall_s", "s"),
    ("run wall time", "wall_s", "s"),
)


def summary_lines(report: dict) -> list[tuple[str, str]]:
    """(label, formatted value) pairs of a summary, in display order."""
    rows = [(label, _fmt(report.get(key), unit)) for label, key, unit in SUMMARY_ROWS]
    for w in report.get("workers", []):
        rows.append((f"CS-X {w['csx']} worker {w['worker']} batches/s",
                     f"{w['batches_per_s']:,.1f} (wafer waited {w['input_wait_s']:.3f} s)"))
    return rows


def format_summary(report: dict, title: str = "run summary") -> str:
    """A plain-text table of :func:`summarize`'s figures."""
    rows = summary_lines(report)
    width = max(len(label) for label, _ in rows)
    lines = [title, "-" * (width + 24)]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines)
