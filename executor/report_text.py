"""The run summary as text: :func:`format_summary` lays out :func:`executor.report.summarize`'s
figures as a table, one labelled row each, the input side (where the workers ran, restarts,
assignment and stragglers) included."""

from __future__ import annotations

import collections
import time
from typing import Optional

from executor.report import pct


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
    ("worker production-rate spread", "worker_rate_spread", "%"),
    ("time to first step", "time_to_first_step_s", "s"),
    ("  tracing", "trace_s", "s"),
    ("  compile", "compile_s", "s"),
    ("utilisation incl. warm-up", "utilisation_incl_warmup", "%"),
    ("warm-up steps (worker start-up)", "warmup_steps", ""),
    ("warm-up time", "warmup_s", "s"),
    ("wafer wall time", "wafer_wall_s", "s"),
    ("run wall time", "wall_s", "s"),
)


def _node(node_id: Optional[str], node_ip: Optional[str] = None) -> str:
    return f"{node_id[:12]} ({node_ip or '?'})" if node_id else "unknown"


def input_side_lines(report: dict) -> list[tuple[str, str]]:
    """The summary's rows on where the input workers ran and every restart: when, at which
    step, on which node it died and where it was started again."""
    rows = []
    nodes = [n for n in report.get("worker_nodes") or [] if n.get("node_id")]
    if nodes:
        count = collections.Counter((n["node_id"], n["node_ip"]) for n in nodes)
        rows.append(("input workers per node", ", ".join(
            f"{_node(i, ip)}: {k}" for (i, ip), k in sorted(count.items()))))
    for e in report.get("restart_events") or []:
        when = time.strftime("%H:%M:%S", time.gmtime(e["t_unix"])) + \
            f".{int(1000 * (e['t_unix'] % 1)):03d} UTC"
        rows.append((f"CS-X {e['wse_id']} worker {e['local_worker_id']} restart "
                     f"{e['restart']}",
                     f"at {when}, step {e['step'] + 1}: died on node {e['died_on']} "
                     f"({e['cause']}); started again on node {e['restarted_on']} from its "
                     f"batch {e['from_batch']}"))
    return rows


def compiler_line(compile_report: Optional[dict]) -> Optional[str]:
    """The run summary's ``compiler`` row from the wafer's compile report: the compiler that
    ran last and, under tiered compilation, what decided it (the trial's median step time of
    each candidate, the failed check, the skip or the compile error); None without a report.

    >>> compiler_line({"compiler": "auto", "active": "inductor", "tier_up": {"trial": {
    ...     "chosen": "inductor", "fx_median_s": 0.0041, "inductor_median_s": 0.0032,
    ...     "steps_each": 20}}})
    'inductor chosen by trial (fx 4.1 ms, inductor 3.2 ms a step, median of 20 steps each)'
    """
    if not compile_report or not compile_report.get("active"):
        return None
    active = compile_report["active"]
    tier = compile_report.get("tier_up") or {}
    trial = tier.get("trial")
    if trial and trial.get("steps_each"):
        verdict = "chosen" if trial["chosen"] == "inductor" else "kept"
        return (f"{trial['chosen']} {verdict} by trial (fx {trial['fx_median_s'] * 1e3:.3g} ms, "
                f"inductor {trial['inductor_median_s'] * 1e3:.3g} ms a step, median of "
                f"{trial['steps_each']} steps each)")
    if tier.get("agreed") is False:
        return (f"{active}: inductor's outputs differed from fx's at step "
                f"{tier['checked_at_step']} (max abs diff {tier['max_abs_diff']:.3g})")
    if tier.get("skipped"):
        return f"{active}: no inductor compile: {tier['skipped']}"
    if tier.get("error"):
        return f"{active}: inductor failed: {tier['error'].splitlines()[0]}"
    if tier:
        return f"{active} (inductor not ready before the run ended)"
    cached = " (from the compile cache)" if compile_report.get("cache_hit") else ""
    return f"{active}{cached}"


def autoscale_lines(autoscale: Optional[dict]) -> list[tuple[str, str]]:
    """Where each CS-X's input workers settled, and the figures the choice rests on."""
    if not autoscale:
        return []
    rows = []
    for s in autoscale["csx"]:
        rows.append((f"CS-X {s['csx']} input workers", s["sentence"]))
        if s["phase"] == "settled" and s.get("reason"):
            rows.append((f"CS-X {s['csx']} autoscale figures", s["reason"]))
    rows.append(("autoscale decisions", f"{len(autoscale['decisions'])} (each logged with its "
                                        "reason; profile.json: summary.autoscale)"))
    return rows


def summary_lines(report: dict) -> list[tuple[str, str]]:
    """(label, formatted value) pairs of a summary, in display order."""
    rows = []
    stopped = report.get("interrupted")
    if stopped:
        rows.append(("INTERRUPTED", f"after {stopped['steps_run']} of {stopped['num_steps']} "
                                    f"steps: {stopped['reason']}"))
    rows += [(label, _fmt(report.get(key), unit)) for label, key, unit in SUMMARY_ROWS]
    compiler = compiler_line(report.get("compile"))
    if compiler:
        rows.append(("compiler", compiler))
    if report.get("input_cpu_cores") is not None:
        cpus = report.get("machine_cpus")
        rows.append(("input workers' CPU demand", f"{report['input_cpu_cores']:.2f} cores"
                     + (f" of {cpus}" if cpus else "")))
    if report.get("gpu_busy_fraction") is not None:
        rows.append(("GPU busy (CUDA events)", pct(report["gpu_busy_fraction"])))
        rows.append(("GPU", report["gpu_verdict"]))
    graph = report.get("cuda_graph")
    if graph:
        rows.append(("CUDA graph", f"recorded at step {graph['recorded_at_step']}, replayed "
                     f"{graph['replays']} times" if graph.get("recorded_at_step")
                     else "not recorded: " + "; ".join(graph.get("why_not") or ["-"])))
    rows += input_side_lines(report)
    rows += autoscale_lines(report.get("autoscale"))
    assignment = report.get("input_assignment")
    if assignment:
        rows.append(("input assignment", f"{assignment['mode']} ({assignment['reason']})"))
        window = assignment.get("reorder_window")
        if window:
            rows.append(("reorder window (batches)", f"mean {window['mean_batches']:.1f}, max "
                         f"{window['max_batches']} of {window['capacity_batches']}"))
        rows.append(("straggler wait", f"{assignment['straggler_wait_s']:.3f} s"))
        rows.append(("stragglers", assignment["verdict"]))
        for w in assignment["workers"]:
            if w["batch_cost_p50_s"] is None:
                continue
            idle, ahead = w.get("waiting_for_numbers_s"), w.get("draws_ahead")
            rows.append((f"CS-X {w['csx']} worker {w['worker']} batch cost",
                         f"p50 {1000 * w['batch_cost_p50_s']:.2f} ms, p99 "
                         f"{1000 * w['batch_cost_p99_s']:.2f} ms ({w['batch_costs']} batches); "
                         f"straggler wait {w['straggler_wait_s']:.3f} s"
                         + ("" if idle is None else f"; waited for numbers {idle:.3f} s")
                         + (f"; loader draws {ahead} ahead" if ahead else "")))
    for w in report.get("workers", []):
        value = f"{w['batches_per_s']:,.1f} (wafer waited {w['input_wait_s']:.3f} s)"
        if w.get("produce_batches_per_s") is not None:
            value += f"; produces {w['produce_batches_per_s']:,.1f}/s"
        rows.append((f"CS-X {w['csx']} worker {w['worker']} batches/s", value))
    return rows


def format_summary(report: dict, title: str = "run summary") -> str:
    """A plain-text table of :func:`summarize`'s figures."""
    rows = summary_lines(report)
    width = max(len(label) for label, _ in rows)
    lines = [title, "-" * (width + 24)]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines)
