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
* ``samples_per_s``: steady-state samples/s on the wafer; ``global_rate``: the porting guide's
  client-side figure (all samples / time since the first step ended on the client);
* per input worker: batches delivered, batches/s, the input wait spent on it and, from the
  worker's own production timing, ``produce_batches_per_s`` (batches / seconds spent producing
  them: what the worker can deliver) and ``cpu_cores`` (CPU seconds per second of wall time);
  ``worker_rate_spread`` = (max - min) / mean of the production rates (round-robin delivery
  gives every worker the same delivered rate, so only production tells a slow worker apart);
  ``input_cpu_cores`` = the workers' CPU demand in cores, beside ``machine_cpus``;
* ``input_assignment`` (:func:`input_assignment`): the assignment mode that ran (dynamic or
  static, and why), the reorder window's occupancy, each worker's batch costs (p50/p99), the
  wait attributable to stragglers, and whether stragglers cost utilisation (and which worker);
* ``time_to_first_step_s``: from the start of the run to the end of the first step on the wafer
  (tracing, compile and start-up included), with ``trace_s`` and ``compile_s`` beside it.
* on a CUDA wafer, the GPU-busy figures of the steady steps (:mod:`executor.gpu_busy`:
  ``gpu_busy_fraction`` from CUDA events, the idle time spent waiting for input) and whether the
  step ran as a CUDA graph (``cuda_graph``: recorded at which step, or why not);
* ``autoscale`` (:func:`autoscale_summary`, autoscaled runs): where each CS-X's worker count
  settled, from which step the wafer ran at it and how busy it was since, the figures the last
  decision rests on, and every decision;
* ``worker_nodes`` and ``restart_events``: the node (id, ip) and process of each input worker
  at the end of the run, and every restart of a worker: when, at which step, the node it died
  on, the cause, and the node it was started again on.

This module computes figures only. :mod:`executor.report_writers` writes them to a TensorBoard
writer and to ``artifact_dir/executors/NNNNNN/`` (``steps.parquet``, one row per step; the
executor writes ``profile.json``), and :mod:`executor.report_text` lays them out as a table.

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

import math
from typing import Any, Optional

from executor.gpu_busy import gpu_busy

#: summary keys written as TensorBoard scalars (under ``summary/``) and shown in tables
SUMMARY_SCALARS = (
    "samples_per_s", "global_rate", "utilisation", "starved_fraction", "client_bound_fraction",
    "mean_buffer_occupancy", "worker_rate_spread", "time_to_first_step_s", "wafer_wall_s",
    "utilisation_incl_warmup", "warmup_s", "trace_s", "compile_s", "gpu_busy_fraction",
    "gpu_input_bound_fraction",
)
#: per-step keys written as TensorBoard scalars (under ``wafer/``)
STEP_SCALARS = ("compute_s", "input_wait_s", "buffer_occupancy", "utilisation", "step_wall_s")


def has_wafer_figures(record: dict) -> bool:
    """True when a step record carries the wafer driver's figures (CSX runs; an interrupted run
    may end with steps the wafer never reported)."""
    return "compute_s" in record and "wafer_t" in record


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
    counts: dict[tuple[int, int], dict] = {}
    for r in records:
        workers = r.get("workers") or []
        share = r.get("input_wait_s", 0.0) / max(len(workers), 1)
        starts, ends = r.get("produce_start_unix"), r.get("produce_end_unix")
        cpu = r.get("produce_cpu_s")
        for c, w in enumerate(workers):
            entry = counts.setdefault((c, int(w)), {"batches": 0, "wait": 0.0, "timed": 0,
                                                    "produce_s": 0.0, "cpu_s": 0.0})
            entry["batches"] += 1
            entry["wait"] += share
            if starts and ends:
                entry["timed"] += 1
                entry["produce_s"] += max(ends[c] - starts[c], 0.0)
            if cpu:
                entry["cpu_s"] += cpu[c]
    out = []
    for (c, w), e in sorted(counts.items()):
        batches = e["batches"]
        out.append({
            "csx": c, "worker": w, "batches": batches,
            "batches_per_s": batches / wafer_wall_s if wafer_wall_s > 0 else 0.0,
            "input_wait_s": e["wait"],
            "produce_s_per_batch": e["produce_s"] / e["timed"] if e["timed"] else None,
            "produce_batches_per_s": (e["timed"] / e["produce_s"] if e["timed"]
                                      and e["produce_s"] > 0 else None),
            "cpu_cores": e["cpu_s"] / wafer_wall_s if e["cpu_s"] and wafer_wall_s > 0 else None,
        })
    return out


def _spread(values: list) -> Optional[float]:
    """(max - min) / mean, None without values."""
    if not values or any(v is None for v in values):
        return None
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean > 0 else 0.0


#: the wafer's figures of a summary, None in the summary of a run without them
_WAFER_KEYS = ("samples_per_s", "utilisation", "starved_fraction", "client_bound_fraction",
               "mean_buffer_occupancy", "worker_rate_spread", "wafer_wall_s",
               "utilisation_incl_warmup", "warmup_steps", "warmup_s", "input_cpu_cores")


def summarize(records: list[dict], *, global_rate: Optional[float] = None,
              wall_s: Optional[float] = None, startup: Optional[dict] = None,
              stream_stats: Optional[list] = None) -> dict:
    """The run's figures from its per-step records (see the module docstring).

    ``global_rate`` and ``wall_s`` are the client's figures; ``startup`` holds ``trace_s``,
    ``compile_s`` and ``time_to_first_step_s`` where known; ``stream_stats`` are the input
    streams' own reports (one per CS-X), kept for straggler and restart counts.
    """
    records = sorted(records, key=lambda r: r["step"])
    if any(has_wafer_figures(r) for r in records):
        # steps the wafer ran (a client that ran ahead of a wafer that failed has more)
        records = [r for r in records if has_wafer_figures(r)]
    samples = sum(int(r.get("samples", 0)) for r in records)
    out: dict[str, Any] = {"steps": len(records), "samples": samples,
                           "global_rate": global_rate, "wall_s": wall_s}
    startup = startup or {}
    for key in ("time_to_first_step_s", "trace_s", "compile_s"):
        out[key] = startup.get(key)
    records = [r for r in records if has_wafer_figures(r)]
    if not records:
        out.update(dict.fromkeys(_WAFER_KEYS), workers=[])
        return out
    out.update(_wafer_figures(records))
    out.update(gpu_busy(records[out["warmup_steps"]:]) or {})
    if stream_stats:
        out.update(_stream_figures(stream_stats, out["input_wait_s"], out["steady_wall_s"]))
    return out


def _wafer_figures(records: list[dict]) -> dict:
    """The wafer clock's figures of ``records`` (every one with the wafer's figures, in step
    order): the whole run, its warm-up, the steady state after it, and each input worker."""
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
    return {
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
        "worker_rate_spread": _spread([w["produce_batches_per_s"] for w in workers]),
        "input_cpu_cores": (sum(w["cpu_cores"] for w in workers)
                            if workers and all(w["cpu_cores"] is not None for w in workers)
                            else None),
        "workers": workers,
    }


def _stream_figures(stream_stats: list, input_wait_s: float, wall_s: float) -> dict:
    """The input streams' own counts: restarts (and each one's event), where the workers ran,
    straggler reports, and :func:`input_assignment`."""
    return {
        "worker_restarts": sum(int(s.get("restarts", 0)) for s in stream_stats),
        "restart_events": sorted((e for s in stream_stats for e in s.get("restart_events", [])),
                                 key=lambda e: e["t_unix"]),
        "worker_nodes": worker_nodes(stream_stats),
        "straggler_reports": sum(len(s.get("stragglers", [])) for s in stream_stats),
        "input_assignment": input_assignment(stream_stats, input_wait_s, wall_s),
    }


def worker_nodes(stream_stats: list) -> list[dict]:
    """Where each input worker ran at the end of the run: ``{"csx", "worker", "node_id",
    "node_ip", "pid"}`` from the streams' reports."""
    return [{"csx": s.get("wse_id", c), "worker": w["local_worker_id"],
             "node_id": w.get("node_id"), "node_ip": w.get("node_ip"), "pid": w.get("pid")}
            for c, s in enumerate(stream_stats) for w in s.get("workers", [])]


STRAGGLER_COST_FRACTION = 0.02
"""Stragglers cost utilisation when the wafer waited for input at least this share of its
steady wall time and at least half of that wait is matched by straggler wait."""


def input_assignment(stream_stats: list, input_wait_s: float, wall_s: float) -> Optional[dict]:
    """Which assignment mode ran, the reorder window's occupancy, each worker's batch costs
    (p50/p99) and the wait attributable to stragglers, from the input streams' reports; and
    whether stragglers cost the wafer utilisation, naming the worker that cost the most.

    The streams count as straggler wait the time they waited for a step while later batches
    were already there (in the reorder window, or in another worker under round-robin): the
    data existed, in the wrong place. Stragglers cost utilisation when the wafer's input wait
    is at least :data:`STRAGGLER_COST_FRACTION` of its steady wall time and the straggler
    wait is at least half of it."""
    streams = [s for s in stream_stats if isinstance(s, dict) and s.get("assignment")]
    if not streams:
        return None
    modes = sorted({s["assignment"]["mode"] for s in streams})
    out: dict[str, Any] = {
        "mode": modes[0] if len(modes) == 1 else "mixed",
        "requested": streams[0]["assignment"].get("requested"),
        "reason": streams[0]["assignment"].get("reason"),
        "reorder_window": _reorder_window(streams),
        "workers": [_assignment_worker(s.get("wse_id", c), w)
                    for c, s in enumerate(streams) for w in s.get("workers", [])],
        "straggler_wait_s": sum(float(s.get("straggler_wait_s", 0.0)) for s in streams),
    }
    out.update(_straggler_verdict(out, input_wait_s, wall_s))
    return out


def _reorder_window(streams: list) -> Optional[dict]:
    """The reorder window's occupancy over the streams that report one (None: none does)."""
    windows = [s["reorder_window"] for s in streams if s.get("reorder_window")]
    if not windows:
        return None
    return {
        "mean_batches": sum(w["mean_batches"] for w in windows) / len(windows),
        "max_batches": max(w["max_batches"] for w in windows),
        "capacity_batches": max(w["capacity_batches"] for w in windows),
    }


def _assignment_worker(csx, w: dict) -> dict:
    """One input worker's row of :func:`input_assignment` from its stream's report ``w``."""
    cost = w.get("batch_cost") or {}
    return {
        "csx": csx, "worker": w["local_worker_id"],
        "batches": w.get("batches"),
        "batch_cost_p50_s": cost.get("p50_s"), "batch_cost_p99_s": cost.get("p99_s"),
        "batch_cost_mean_s": cost.get("mean_s"), "batch_costs": cost.get("count", 0),
        "straggler_wait_s": float(w.get("straggler_wait_s", 0.0)),
        # dynamic assignment: time the worker waited for its next number (None: static)
        "waiting_for_numbers_s": w.get("waiting_for_numbers_s"),
        # dynamic assignment: index batches its loader draws ahead (numbers granted)
        "draws_ahead": w.get("draws_ahead")}


def _straggler_verdict(assignment: dict, input_wait_s: float, wall_s: float) -> dict:
    """Whether stragglers cost utilisation (see :func:`input_assignment`), the worker that cost
    the most where they did, and the verdict in words."""
    straggler, workers = assignment["straggler_wait_s"], assignment["workers"]
    starved = input_wait_s / wall_s if wall_s > 0 else 0.0
    worst = max(workers, key=lambda w: w["straggler_wait_s"], default=None)
    costly = starved >= STRAGGLER_COST_FRACTION and straggler >= 0.5 * input_wait_s \
        and worst is not None and worst["straggler_wait_s"] > 0
    out: dict[str, Any] = {
        "stragglers_cost_utilisation": bool(costly),
        "straggler_worker": {"csx": worst["csx"], "worker": worst["worker"]} if costly else None,
    }
    if costly:
        hint = (" Dynamic assignment (CSConfig.input_assignment='dynamic') would let the other "
                "workers go on." if assignment["mode"] == "static" else
                " Under dynamic assignment this means the reorder window filled behind it: a "
                "batch slower than the window covers, or a worker much slower than the rest.")
        out["verdict"] = (
            f"stragglers cost utilisation: the wafer waited for input {pct(starved)} of its "
            f"steady time, and {straggler:.3f} s of waiting was for a step whose later batches "
            f"were already there, most of it ({worst['straggler_wait_s']:.3f} s) for CS-X "
            f"{worst['csx']} worker {worst['worker']}.{hint}")
    elif starved >= STRAGGLER_COST_FRACTION:
        out["verdict"] = (
            f"stragglers did not cost utilisation: the wafer waited for input {pct(starved)} of "
            "its steady time, but little of it for a straggler: the input side as a whole is "
            "slower than the wafer (more workers, or cheaper batches)")
    else:
        out["verdict"] = "stragglers did not cost utilisation: the wafer rarely waited for input"
    return out


def summarize_profile(profile: dict) -> dict:
    """:func:`summarize` applied to a ``profile.json`` document (as :func:`load_run` returns),
    with the run's name, its machine's CPU count, the wafer's compile report (``compile``)
    and, for a run that stopped early, ``interrupted`` (steps run, steps planned, the
    reason)."""
    summary = profile.get("summary", {})
    out = summarize(profile.get("steps", []), global_rate=profile.get("global_rate"),
                    wall_s=summary.get("wall_s"), startup=summary.get("startup"),
                    stream_stats=summary.get("workers"))
    out["autoscale"] = autoscale_summary(summary.get("autoscale"), profile.get("steps", []))
    out["interrupted"] = profile.get("interrupted")
    out["compile"] = summary.get("compile")
    out["cuda_graph"] = (summary.get("compile") or {}).get("cuda_graph")
    out["machine_cpus"] = profile.get("machine_cpus")
    if profile.get("name"):
        out["name"] = profile["name"]
    return out


def autoscale_summary(autoscale: Optional[dict], records: list[dict]) -> Optional[dict]:
    """An autoscaled run's outcome per CS-X from the wafer driver's autoscaling record
    (``summary["autoscale"]`` of the profile) and the step records: the count it settled at,
    the step of its last change, the first step of its settled windows and the wafer's
    utilisation from there to the end, with the controller's last reason (the figures the
    choice rests on) and a sentence saying it; None for a run that did not autoscale.

    >>> recs = [{"step": s, "compute_s": 0.01, "input_wait_s": 0.0, "wafer_t": 0.01 * s}
    ...         for s in range(1, 201)]
    >>> a = {"settled": [{"csx": 0, "workers": 3, "phase": "settled", "changed_at": 140,
    ...      "settled_since": 161, "reason": "..."}], "decisions": [{}, {}]}
    >>> autoscale_summary(a, recs)["csx"][0]["sentence"]
    'settled at 3 workers per CS-X after 140 steps; wafer 100.0% busy since step 161'
    """
    if not autoscale:
        return None
    rows = [r for r in step_rows([r for r in records if has_wafer_figures(r)])
            if "step_wall_s" in r]
    out = []
    for s in autoscale.get("settled", []):
        since = s.get("settled_since")
        after = [r for r in rows if since is not None and r["step"] >= since]
        wall = sum(r["step_wall_s"] for r in after)
        busy = sum(r["compute_s"] for r in after) / wall if wall > 0 else None
        n = s["workers"]
        when = f"after {s['changed_at']} steps" if s["changed_at"] else "from the start"
        if s["phase"] == "settled" and busy is not None:
            sentence = (f"settled at {n} worker{'s' if n != 1 else ''} per CS-X {when}; wafer "
                        f"{pct(busy)} busy since step {since}")
        else:
            sentence = (f"{n} worker{'s' if n != 1 else ''} per CS-X at the end ({s['phase']}, "
                        f"last changed {when}): {s['reason'] or 'no window was read'}")
        out.append({**s, "busy_since_settled": busy, "sentence": sentence})
    return {"csx": out, "decisions": autoscale.get("decisions", []),
            "config": autoscale.get("config"), "history": autoscale.get("history", [])}


def wafer_rate(stats: dict, window: int = 10) -> Optional[float]:
    """samples/s of the wafer over its last ``window`` reported steps (``stats``: step -> the
    wafer's per-step figures, as the CSX run collects them); None before two steps."""
    if len(stats) < 2:
        return None
    last = max(stats)
    first = max(min(stats), last - window)
    if first not in stats or last not in stats:
        return None
    span = stats[last]["wafer_t"] - stats[first]["wafer_t"]
    samples = sum(int(stats[s].get("samples", 0)) for s in range(first + 1, last + 1)
                  if s in stats)
    return samples / span if span > 0 else None


def pct(value: float) -> str:
    """A fraction as a percentage with one decimal, rounded down (so 94.98% never reads as a
    95% target reached)."""
    return f"{math.floor(1000 * value + 1e-9) / 10:.1f}%"
