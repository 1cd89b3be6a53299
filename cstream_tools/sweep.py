"""The planning, record and advice of ``cstream sweep``: the grid's points, the rows measured
per point and kept in ``sweep.json``, the table and the advice for a CS-X count no worker count
served; :mod:`cstream_tools.cli_run` parses the command line and calls these."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from cstream_tools import sweep_answer
from cstream_tools.cli_errors import CLIError


def layout(cs) -> str:
    wafer = ("as fast as the step runs" if cs.wafer_samples_per_sec is None
             and cs.wafer_seconds_per_step is None else
             f"{cs.wafer_samples_per_sec:g} samples/s per CS-X" if cs.wafer_samples_per_sec
             is not None
             else f"{1000 * cs.wafer_seconds_per_step:g} ms/step")
    workers = (f"auto ({cs.autoscale.min_workers_per_csx}-{cs.autoscale.max_workers_per_csx}, "
               f"from {cs.num_workers_per_csx})" if cs.autoscaling else cs.num_workers_per_csx)
    return f"{cs.num_csx} CS-X x {workers} workers, wafer {wafer}"



def sweep_points(exp, workers: list[int], csx: list[int]) -> list:
    """The experiments of a sweep grid, CS-X count outer, worker count inner."""
    from cstream_tools.experiment import with_layout

    return [with_layout(exp, num_csx=c, num_workers_per_csx=w, autoscale=None)
            for c in csx for w in workers]


def best_counts(rows: list[dict], target: float) -> dict[int, Optional[int]]:
    """Per CS-X count: the smallest worker count whose utilisation reaches ``target``."""
    out: dict[int, Optional[int]] = {}
    for c in sorted({r["num_csx"] for r in rows}):
        ok = [r["num_workers_per_csx"] for r in rows if r["num_csx"] == c
              and r.get("utilisation") is not None and r["utilisation"] >= target]
        out[c] = min(ok) if ok else None
    return out


MACHINE_BOUND_SHARE = 0.75
"""Input workers whose CPU demand reaches this share of the machine's cores are machine-bound:
more of them share the same cores."""


def advice(rows: list[dict], target: float) -> str:
    """Why no worker count of one CS-X count reached ``target``, and what to try.

    * client-bound -- the wafer waited for the client more than for input;
    * machine-bound -- the input buffer was full when steps began (the workers kept up) and the
      wafer still lost time taking batches: the wafer driver shares the machine's cores with the
      workers; or the workers' CPU demand (CPU seconds per second, measured in each worker)
      reached :data:`MACHINE_BOUND_SHARE` of the machine's cores. More workers share the same
      cores;
    * input-bound -- the wafer starved with an empty buffer while cores were free: more
      workers help.

    >>> row = {"num_csx": 1, "num_workers_per_csx": 4, "utilisation": 0.5,
    ...        "starved_fraction": 0.5, "client_bound_fraction": 0.0, "machine_cpus": 2,
    ...        "mean_buffer_occupancy": 0.1, "buffer_batches": 4}
    >>> advice([dict(row, input_cpu_cores=1.9)], 0.95).split(":")[0]
    'machine-bound'
    >>> advice([dict(row, input_cpu_cores=0.2)], 0.95).split(":")[0]
    'input-bound'
    >>> advice([dict(row, input_cpu_cores=0.2, mean_buffer_occupancy=3.9)], 0.95).split(":")[0]
    'machine-bound'
    """
    rows = sorted(rows, key=lambda r: r["num_workers_per_csx"])
    last = rows[-1]
    w, c = last["num_workers_per_csx"], last["num_csx"]
    starved = last.get("starved_fraction") or 0.0
    client = last.get("client_bound_fraction") or 0.0
    demand, cpus = last.get("input_cpu_cores"), last.get("machine_cpus")
    occupancy, depth = last.get("mean_buffer_occupancy"), last.get("buffer_batches")
    changed = ""
    if len(rows) > 1 and rows[-2].get("samples_per_s") and last.get("samples_per_s"):
        before = rows[-2]
        change = last["samples_per_s"] / before["samples_per_s"] - 1
        changed = (f" From {before['num_workers_per_csx']} to {w} workers per CS-X samples/s "
                   f"changed by {change:+.0%}.")
    if client > starved and client > 0.02:
        return (f"client-bound: at {w} workers per CS-X the wafer waited {client:.0%} of its "
                f"time for the client (step closures, checkpoints, the script's own work) and "
                f"{starved:.0%} for input; more workers cannot help.{changed}")
    on_cores = f" on this machine's {cpus} cores" if cpus else ""
    if occupancy is not None and depth and occupancy >= 0.5 * depth:
        return (f"machine-bound: at {w} workers per CS-X the input buffer held {occupancy:.1f} "
                f"of its {depth} batches when a step began, so the workers kept ahead, yet the "
                f"wafer lost {starved:.0%} of its time taking batches: the wafer "
                f"driver shares the cores with {c * w} input workers{on_cores}"
                + (f" (the workers used {demand:.1f} of them)" if demand is not None else "")
                + ". More workers "
                f"cannot help; measure with more cores (a Ray cluster: backend address).{changed}")
    if demand is not None and cpus and demand >= MACHINE_BOUND_SHARE * cpus:
        return (f"machine-bound: {c * w} input workers ({w} per CS-X) kept {demand:.1f} of this "
                f"machine's {cpus} cores busy, so more workers share the same cores; measure on "
                f"more cores (a Ray cluster: backend address) or make input_fn cheaper.{changed}")
    return (f"input-bound: at {w} workers per CS-X the wafer starved {starved:.0%} of its time"
            + (f" while the workers used {demand:.1f} of {cpus} cores" if demand is not None
               and cpus else "")
            + f"; add workers (try {2 * w} per CS-X).{changed}")


def sweep_table(rows: list[dict], target: float) -> str:
    best = best_counts(rows, target)
    header = ("num_csx", "workers/CS-X", "samples/s", "utilisation", "input-starved",
              "buffer occ.", "worker spread", "")
    lines = []
    for r in rows:
        mark = "*" if best.get(r["num_csx"]) == r["num_workers_per_csx"] else ""
        lines.append((str(r["num_csx"]), str(r["num_workers_per_csx"]),
                      _num(r.get("samples_per_s")), _pct(r.get("utilisation")),
                      _pct(r.get("starved_fraction")), _num(r.get("mean_buffer_occupancy"), 2),
                      _pct(r.get("worker_rate_spread")), mark))
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
    out += [fmt.format(*x).rstrip() for x in lines]
    for c, w in best.items():
        if w is None:
            out.append(f"num_csx={c}: no worker count in the grid keeps utilisation >= "
                       f"{target:.0%}; " + advice([r for r in rows if r["num_csx"] == c], target))
        else:
            out.append(f"num_csx={c}: * smallest worker count with utilisation >= {target:.0%}: "
                       f"{w} per CS-X")
    return "\n".join(out)


def _num(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v) -> str:
    from executor.report import pct

    return "-" if v is None else pct(v)


def plot_sweep(rows: list[dict], target: float, path: Path, title: str,
               note: Optional[list] = None) -> Path:
    from cstream_tools.cli_plots import plot_sweep as draw

    return draw(rows, target, path, title, best_counts(rows, target), note=note)


SWEEP_ROW_KEYS = ("samples_per_s", "global_rate", "utilisation", "starved_fraction",
                  "client_bound_fraction", "mean_buffer_occupancy", "worker_rate_spread",
                  "input_cpu_cores", "machine_cpus", "time_to_first_step_s", "wafer_wall_s",
                  "steps", "samples")


def sweep_row(exp, result) -> dict:
    return {"num_csx": exp.cs_config.num_csx,
            "num_workers_per_csx": exp.cs_config.num_workers_per_csx,
            "buffer_batches": exp.cs_config.input_buffer_batches,
            "run_dir": str(result.run_dir), **{k: result.report.get(k) for k in SWEEP_ROW_KEYS},
            **sweep_answer.worker_figures(result.report)}


def _write_sweep(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float))
    os.replace(tmp, path)


class SweepRecord:
    """The sweep's ``sweep.json``: the grid, the experiment and the rows measured so far."""

    def __init__(self, args, exp, points: list, path: Path, rows: list[dict]):
        self.args, self.exp, self.path = args, exp, path
        self.title = f"{exp.name}: {layout(points[0].cs_config).split(', ', 1)[1]}"
        self.grid = [(p.cs_config.num_csx, p.cs_config.num_workers_per_csx) for p in points]
        self.rows = [r for r in rows if (r["num_csx"], r["num_workers_per_csx"]) in self.grid]
        self.done = {(r["num_csx"], r["num_workers_per_csx"]) for r in self.rows}

    def write(self, complete: bool) -> dict:
        """Write ``sweep.json`` (atomically) and return what it holds."""
        grid, target = self.grid, self.args.target
        ordered = sorted(self.rows,
                         key=lambda r: grid.index((r["num_csx"], r["num_workers_per_csx"])))
        doc = {"name": self.exp.name, "config": str(self.args.config or self.args.modelzoo),
               "target": target,
               "title": self.title, "experiment": self.exp.to_dict(), "complete": complete,
               "grid": [list(g) for g in grid], "rows": ordered,
               "best": {str(k): v for k, v in best_counts(ordered, target).items()}}
        doc["answer"] = sweep_answer.answer(ordered, target, doc["experiment"],
                                            getattr(self.args, "wafer_speed", None),
                                            sweep_answer.plan_of(self.args),
                                            getattr(self.args, "answer_notes", None))
        _write_sweep(self.path, doc)
        return doc


def earlier_rows(args, out: Path, sweep_file: Path) -> list[dict]:
    """The rows a resumed sweep measured before; CLIError where --resume and --out disagree
    with what the folder holds."""
    if not sweep_file.is_file():
        if args.resume:
            raise CLIError(f"--resume: {out} holds no sweep.json to continue; run the sweep "
                           "without --resume first.")
        return []
    if not args.resume:
        raise CLIError(f"{out} already holds a sweep ({sweep_file}); pass --resume to "
                       "continue it, or choose another --out.")
    try:
        return list(json.loads(sweep_file.read_text())["rows"])
    except (ValueError, KeyError) as e:
        raise CLIError(f"{sweep_file} is not a sweep record ({e}); remove it or "
                       "choose another --out.") from None


def run_points(points: list, record: SweepRecord, out: Path) -> None:
    """Run every point of the grid not measured yet, writing ``sweep.json`` after each; Ray is
    started once for them all (and stopped after, if this started it)."""
    from cstream_tools.experiment import run_experiment

    exp = points[0]
    csx = exp.backend.options if exp.backend.type == "CSX" else None
    if csx is not None and csx.in_process:
        print("note: in_process runs every input worker in this process, one after another, so "
              "more workers cannot deliver faster; sweep on Ray to measure the input side.")
    ray_started = False
    try:
        if csx is not None and not csx.in_process:
            from cstream.backend import resolve_csx_options
            from executor.ray_session import ensure_ray

            ray_started = ensure_ray(address=resolve_csx_options(csx).address)
        for i, point in enumerate(points, 1):
            cs = point.cs_config
            where = f"[{i}/{len(points)}] num_csx={cs.num_csx} num_workers_per_csx=" \
                    f"{cs.num_workers_per_csx}"
            if (cs.num_csx, cs.num_workers_per_csx) in record.done:
                print(f"{where}: measured earlier (sweep.json)", flush=True)
                continue
            print(f"{where} ...", flush=True)
            result = run_experiment(point, artifact_dir=out / f"csx{cs.num_csx}-w"
                                    f"{cs.num_workers_per_csx}")
            record.rows.append(sweep_row(point, result))
            record.write(complete=False)
    finally:
        if ray_started:
            import ray

            ray.shutdown()


def sweep_interrupted(args, record: SweepRecord, num_points: int, out: Path) -> None:
    """Keep the points measured, show them, and say how to continue."""
    doc = record.write(complete=False)
    if doc["rows"]:
        print(sweep_table(doc["rows"], args.target))
    print(f"sweep interrupted after {len(doc['rows'])} of {num_points} points; "
          f"{record.path} keeps them. Continue with: cstream sweep "
          f"{args.config or '--modelzoo ' + str(args.modelzoo)} "
          f"--num-workers-per-csx {','.join(map(str, args.num_workers_per_csx))}"
          + (f" --num-csx {','.join(map(str, args.num_csx))}" if args.num_csx else "")
          + f" --out {out} --resume", flush=True)

