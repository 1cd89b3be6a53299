"""``cstream run``, ``cstream sweep`` and ``cstream report``: experiments from the command line.

``add_parser(subparsers)`` adds the three subcommands to the ``cstream`` command's parser
(:mod:`cstream.cli`); each subcommand's function returns the process exit status (0 ok, 1 the
run or its files failed, 2 bad arguments or a bad experiment file).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Optional

UTILISATION_TARGET = 0.95


class CliError(Exception):
    """A user mistake reported as one line, exit status 2."""


def _fail(command: str, message: str, status: int) -> int:
    print(f"cstream {command}: error: {message}", file=sys.stderr)
    return status


# -- arguments -------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of positive ints such as 1,2,4,8, got {text!r}"
            ) from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"every value must be at least 1, got {v} in {text!r}")
        values.append(v)
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a value")
    return sorted(values)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _add_overrides(p: argparse.ArgumentParser, layout: bool = True) -> None:
    g = p.add_argument_group("overrides (replace the experiment file's values)")
    g.add_argument("--steps", type=_positive_int, metavar="N", help="steps to run")
    if layout:
        g.add_argument("--num-csx", type=_positive_int, metavar="N", help="cs_config.num_csx")
        g.add_argument("--num-workers-per-csx", type=_positive_int, metavar="N",
                       help="cs_config.num_workers_per_csx")
    g.add_argument("--wafer-samples-per-sec", type=_positive_float, metavar="X",
                   help="cs_config.wafer_samples_per_sec (replaces wafer_seconds_per_step)")
    g.add_argument("--wafer-seconds-per-step", type=_positive_float, metavar="S",
                   help="cs_config.wafer_seconds_per_step (replaces wafer_samples_per_sec)")
    g.add_argument("--artifact-dir", metavar="DIR", help="where runs and checkpoints are written")
    g.add_argument("--in-process", action="store_true",
                   help="CSX: run the wafer driver and input workers in this process (no Ray; "
                        "input workers then run one after another)")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def add_parser(subparsers) -> None:
    """Add ``run``, ``sweep`` and ``report`` to the ``cstream`` command's subparsers."""
    p = subparsers.add_parser(
        "run", formatter_class=_Formatter,
        help="run an experiment file; progress bar, then a summary table",
        description="Run the experiment described by CONFIG (a YAML file, see configs/).\n\n"
                    "Shows a progress bar (step, loss, samples/s, input-buffer fill) and prints a\n"
                    "summary table at the end. The run's profile (profile.json, steps.parquet)\n"
                    "and TensorBoard events are written to ARTIFACT_DIR/executors/NNNNNN/.",
        epilog="example:\n  cstream run configs/digits_mlp.yaml --steps 100")
    p.add_argument("config", metavar="CONFIG", help="experiment YAML file")
    _add_overrides(p)
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print the summary as JSON, not a table")
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser(
        "sweep", formatter_class=_Formatter,
        help="run an experiment for several worker counts; table and PNG plot",
        description="Run CONFIG once per point of the grid --num-workers-per-csx x --num-csx,\n"
                    "print samples/s, wafer utilisation and input starvation per point, and\n"
                    "write sweep.png (samples/s and utilisation against the worker count) and\n"
                    "sweep.json into --out. The smallest worker count that keeps the wafer\n"
                    f"utilisation >= {UTILISATION_TARGET:.0%} is marked (*) in the table and the "
                    "plot.",
        epilog="example:\n  cstream sweep configs/input_sleep_150ms.yaml "
               "--num-workers-per-csx 1,2,4,8")
    p.add_argument("config", metavar="CONFIG", help="experiment YAML file")
    p.add_argument("--num-workers-per-csx", type=_int_list, required=True, metavar="LIST",
                   help="comma-separated worker counts per CS-X, e.g. 1,2,4,8")
    p.add_argument("--num-csx", type=_int_list, default=None, metavar="LIST",
                   help="comma-separated CS-X counts, e.g. 1,2 (default: the file's num_csx)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output folder (default: ARTIFACT_DIR/sweeps/<name>-<time>)")
    p.add_argument("--target", type=float, default=UTILISATION_TARGET, metavar="U",
                   help=f"utilisation to mark the smallest worker count for (default "
                        f"{UTILISATION_TARGET})")
    _add_overrides(p, layout=False)
    p.set_defaults(func=cmd_sweep)

    p = subparsers.add_parser(
        "report", formatter_class=_Formatter,
        help="re-print a run's or a sweep's summary and redraw its plot",
        description="RUN_DIR is a run directory (ARTIFACT_DIR/executors/NNNNNN or .../latest):\n"
                    "prints its summary table and writes report.png (samples/s, utilisation and\n"
                    "input-buffer occupancy per step) into it. For a sweep folder (one holding\n"
                    "sweep.json) it prints the sweep table and redraws sweep.png.",
        epilog="example:\n  cstream report cstream_logs/executors/latest")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory or sweep folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON, not a table")
    p.set_defaults(func=cmd_report)


# -- shared ----------------------------------------------------------------------------------------
def _experiment(args, command: str):
    import dataclasses

    from cstream.experiment import ExperimentError, load_experiment, with_layout

    exp = load_experiment(args.config)
    if os.getcwd() not in sys.path:  # import paths in the file resolve from here, as python -m
        sys.path.insert(0, os.getcwd())
    changes = {}
    if getattr(args, "num_csx", None) is not None and command == "run":
        changes["num_csx"] = args.num_csx
    if getattr(args, "num_workers_per_csx", None) is not None and command == "run":
        changes["num_workers_per_csx"] = args.num_workers_per_csx
    if args.wafer_samples_per_sec is not None and args.wafer_seconds_per_step is not None:
        raise ExperimentError("give --wafer-samples-per-sec or --wafer-seconds-per-step, not both")
    if args.wafer_samples_per_sec is not None:
        changes.update(wafer_samples_per_sec=args.wafer_samples_per_sec,
                       wafer_seconds_per_step=None)
    if args.wafer_seconds_per_step is not None:
        changes.update(wafer_seconds_per_step=args.wafer_seconds_per_step,
                       wafer_samples_per_sec=None)
    if changes:
        exp = with_layout(exp, **changes)
    if args.steps is not None:
        exp = dataclasses.replace(exp, steps=args.steps)
    if args.artifact_dir is not None:
        exp = dataclasses.replace(exp, artifact_dir=args.artifact_dir)
    if args.in_process:
        if exp.backend.type != "CSX":
            raise ExperimentError(f"--in-process applies to the CSX backend; {args.config} uses "
                                  f"{exp.backend.type}")
        backend = dataclasses.replace(exp.backend, options={**exp.backend.options,
                                                            "in_process": True})
        exp = dataclasses.replace(exp, backend=backend)
    return exp


def _user_errors():
    from cstream.experiment import ExperimentError

    return (ExperimentError, FileNotFoundError)


def _run_errors():
    from executor.driver import DriverError

    return (ValueError, TypeError, RuntimeError, DriverError)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


# -- progress --------------------------------------------------------------------------------------
class _ProgressDisplay:
    """A rich progress bar on a terminal; elsewhere a plain line every tenth of the run."""

    def __init__(self, total: int, name: str, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.tty = enabled and sys.stdout.isatty()
        self._bar = None
        self._next_line = 0
        if self.tty:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), transient=False)
            self._task = self._bar.add_task(name, total=total, info="")
            self._bar.start()

    @staticmethod
    def _info(p) -> str:
        loss = "-" if p.loss is None else f"{p.loss:.4f}"
        rate = "-" if p.rate is None else f"{p.rate:,.1f}"
        fill = "-" if p.buffer_fill is None else f"{p.buffer_fill:.1f}"
        return f"loss {loss}  rate {rate} samples/s  buffer {fill} batches ready"

    def __call__(self, p) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=p.step, info=self._info(p))
        elif p.step >= self._next_line or p.step == p.num_steps:
            print(f"step {p.step}/{p.num_steps}  {self._info(p)}", flush=True)
            self._next_line = p.step + max(1, p.num_steps // 10)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# -- run -------------------------------------------------------------------------------------------
def cmd_run(args) -> int:
    from cstream.experiment import run_experiment
    from executor.report import format_summary

    try:
        exp = _experiment(args, "run")
    except _user_errors() as e:
        return _fail("run", str(e), 2)
    display = _ProgressDisplay(exp.steps, exp.name, enabled=not args.no_progress)
    try:
        result = run_experiment(exp, progress=display)
    except _user_errors() as e:
        return _fail("run", str(e), 2)
    except _run_errors() as e:
        return _fail("run", _first_line(e), 1)
    finally:
        display.close()
    if args.json:
        print(json.dumps({"run_dir": str(result.run_dir), **result.report}, default=float))
    else:
        print(format_summary(result.report, title=f"{exp.name}: {_layout(exp.cs_config)}"))
        print(f"run directory: {result.run_dir}")
    return 0


def _layout(cs) -> str:
    wafer = ("as fast as the step runs" if cs.wafer_samples_per_sec is None
             and cs.wafer_seconds_per_step is None else
             f"{cs.wafer_samples_per_sec:g} samples/s" if cs.wafer_samples_per_sec is not None
             else f"{1000 * cs.wafer_seconds_per_step:g} ms/step")
    return (f"{cs.num_csx} CS-X x {cs.num_workers_per_csx} workers, wafer {wafer}")


# -- sweep -----------------------------------------------------------------------------------------
def sweep_points(exp, workers: list[int], csx: list[int]) -> list:
    """The experiments of a sweep grid, CS-X count outer, worker count inner."""
    from cstream.experiment import with_layout

    return [with_layout(exp, num_csx=c, num_workers_per_csx=w) for c in csx for w in workers]


def best_counts(rows: list[dict], target: float) -> dict[int, Optional[int]]:
    """Per CS-X count: the smallest worker count whose utilisation reaches ``target``."""
    out: dict[int, Optional[int]] = {}
    for c in sorted({r["num_csx"] for r in rows}):
        ok = [r["num_workers_per_csx"] for r in rows if r["num_csx"] == c
              and r.get("utilisation") is not None and r["utilisation"] >= target]
        out[c] = min(ok) if ok else None
    return out


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
                       f"{target:.0%}; try more workers per CS-X.")
        else:
            out.append(f"num_csx={c}: * smallest worker count with utilisation >= {target:.0%}: "
                       f"{w} per CS-X")
    return "\n".join(out)


def _num(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v) -> str:
    from executor.report import pct

    return "-" if v is None else pct(v)


def plot_sweep(rows: list[dict], target: float, path: Path, title: str) -> Path:
    """samples/s (left axis) and wafer utilisation (right axis) against workers per CS-X."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_counts(rows, target)
    xs = sorted({r["num_workers_per_csx"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax2 = ax.twinx()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, c in enumerate(sorted({r["num_csx"] for r in rows})):
        pts = [r for r in rows if r["num_csx"] == c]
        x = [r["num_workers_per_csx"] for r in pts]
        colour = colours[i % len(colours)]
        ax.plot(x, [r.get("samples_per_s") or 0 for r in pts], "o-", color=colour,
                label=f"samples/s, {c} CS-X")
        ax2.plot(x, [100 * (r.get("utilisation") or 0) for r in pts], "s--", color=colour,
                 alpha=0.7, label=f"utilisation, {c} CS-X")
        if best[c] is not None:
            ax.axvline(best[c], color=colour, linestyle=":", linewidth=1.5)
            left = best[c] == xs[-1] and len(xs) > 1
            ax2.annotate(f"{best[c]} workers/CS-X\nreach {target:.0%}",
                         (best[c], 100 * target), textcoords="offset points",
                         xytext=(-6 if left else 6, -30), ha="right" if left else "left",
                         fontsize=8, color=colour)
    ax2.axhline(100 * target, color="grey", linewidth=0.8, linestyle="-.")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlim(xs[0] / 1.25, xs[-1] * 1.25)
    ax.set_xlabel("input workers per CS-X")
    ax.set_ylabel("samples/s (wafer)")
    ax2.set_ylabel("wafer utilisation (%)")
    ax2.set_ylim(0, 105)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _sweep_row(exp, result) -> dict:
    keep = ("samples_per_s", "global_rate", "utilisation", "starved_fraction",
            "client_bound_fraction", "mean_buffer_occupancy", "worker_rate_spread",
            "time_to_first_step_s", "wafer_wall_s", "steps", "samples")
    return {"num_csx": exp.cs_config.num_csx,
            "num_workers_per_csx": exp.cs_config.num_workers_per_csx,
            "run_dir": str(result.run_dir), **{k: result.report.get(k) for k in keep}}


def cmd_sweep(args) -> int:
    from cstream.experiment import run_experiment

    try:
        if not 0 < args.target <= 1:
            raise CliError(f"--target: expected a utilisation in (0, 1], got {args.target}")
        exp = _experiment(args, "sweep")
        csx = args.num_csx or [exp.cs_config.num_csx]
        points = sweep_points(exp, args.num_workers_per_csx, csx)
    except (CliError, *_user_errors()) as e:
        return _fail("sweep", str(e), 2)
    out = Path(args.out) if args.out else (
        Path(exp.artifact_dir) / "sweeps" / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    title = f"{exp.name}: {_layout(points[0].cs_config).split(', ', 1)[1]}"
    rows = []
    ray_started = False
    if exp.backend.options.get("in_process"):
        print("note: in_process runs every input worker in this process, one after another, so "
              "more workers cannot deliver faster; sweep on Ray to measure the input side.")
    try:
        if exp.backend.type == "CSX" and not exp.backend.options.get("in_process"):
            from executor.ray_session import ensure_ray

            ray_started = ensure_ray(address=exp.backend.options.get("address"))
        for i, point in enumerate(points, 1):
            cs = point.cs_config
            print(f"[{i}/{len(points)}] num_csx={cs.num_csx} num_workers_per_csx="
                  f"{cs.num_workers_per_csx} ...", flush=True)
            result = run_experiment(point, artifact_dir=out / f"csx{cs.num_csx}-w"
                                    f"{cs.num_workers_per_csx}")
            rows.append(_sweep_row(point, result))
    except _user_errors() as e:
        return _fail("sweep", str(e), 2)
    except _run_errors() as e:
        return _fail("sweep", _first_line(e), 1)
    finally:
        if ray_started:
            import ray

            ray.shutdown()
    doc = {"name": exp.name, "config": str(args.config), "target": args.target, "title": title,
           "experiment": exp.to_dict(), "rows": rows,
           "best": {str(k): v for k, v in best_counts(rows, args.target).items()}}
    (out / "sweep.json").write_text(json.dumps(doc, indent=1, default=float))
    png = plot_sweep(rows, args.target, out / "sweep.png", title)
    print(sweep_table(rows, args.target))
    print(f"plot: {png}")
    print(f"sweep folder: {out}")
    return 0


# -- report ----------------------------------------------------------------------------------------
def plot_run(profile: dict, report: dict, path: Path, title: str) -> Path:
    """Per step: wafer utilisation and input-buffer occupancy; samples/s over a moving window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from executor.report import step_rows

    rows = step_rows(profile.get("steps", []))
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    if rows and "utilisation" in rows[0]:
        ax.plot(steps, [100 * r["utilisation"] for r in rows], label="utilisation (%)")
        ax.plot(steps, [100 * r["input_wait_s"] / r["step_wall_s"] if r["step_wall_s"] > 0 else 0
                        for r in rows], label="input-starved (%)", alpha=0.8)
        ax.set_ylabel("% of the step's wall time")
        ax.set_ylim(0, 105)
        ax2 = ax.twinx()
        ax2.plot(steps, [r.get("buffer_occupancy", 0) for r in rows], color="grey", alpha=0.6,
                 label="input-buffer occupancy (batches)")
        ax2.set_ylabel("batches ready")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper center", ncol=3,
                  bbox_to_anchor=(0.5, -0.14))
    else:
        times = [r["time"] for r in rows]
        rates = [r["samples"] / (t1 - t0) if t1 > t0 else 0.0
                 for r, t0, t1 in zip(rows[1:], times, times[1:])]
        ax.plot(steps[1:], rates, label="samples/s")
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def cmd_report(args) -> int:
    from executor.report import format_summary, load_run, summarize_profile

    run_dir = Path(args.run_dir)
    try:
        if (run_dir / "sweep.json").is_file():
            try:
                doc = json.loads((run_dir / "sweep.json").read_text())
                rows, target = doc["rows"], float(doc["target"])
            except (ValueError, KeyError) as e:
                raise CliError(f"{run_dir / 'sweep.json'} is not a sweep record ({e})") from None
            png = plot_sweep(rows, target, run_dir / "sweep.png", doc.get("title", doc["name"]))
            if args.json:
                print(json.dumps(doc, default=float))
            else:
                print(sweep_table(rows, target))
                print(f"plot: {png}")
            return 0
        profile = load_run(run_dir)
        report = summarize_profile(profile)
    except (CliError, FileNotFoundError, ValueError) as e:
        return _fail("report", str(e), 2)
    cs = profile.get("cs_config") or {}
    title = f"run {run_dir.resolve().name}"
    if cs and report.get("utilisation") is not None:  # a wafer run
        from workers.config import CSConfig

        title += f": {_layout(CSConfig(**cs))}"
    png = plot_run(profile, report, run_dir / "report.png", title)
    if args.json:
        print(json.dumps(report, default=float))
    else:
        print(format_summary(report, title=title))
        print(f"plot: {png}")
    return 0
