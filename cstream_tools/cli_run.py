"""``cstream run``, ``cstream sweep`` and ``cstream report``: experiments from the command line.

``add_parser(subparsers)`` adds the three subcommands to the ``cstream`` command's parser
(:mod:`cstream_tools.cli`); each subcommand's function returns the process exit status (0 ok, 1 the
run or its files failed, 2 bad arguments or a bad experiment file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from cstream_tools import modelzoo_input, sweep_answer
from cstream_tools.cli_errors import CLIError
from cstream_tools.cli_progress import ProgressDisplay
from cstream_tools.sweep import (SweepRecord, earlier_rows, layout, plot_sweep, run_points, sweep_interrupted,
                               sweep_points, sweep_table)
from workers.checks import positive_int, positive_number

UTILISATION_TARGET = 0.95


def _fail(command: str, message: str, status: int) -> int:
    print(f"cstream {command}: error: {message}", file=sys.stderr)
    return status


# -- arguments -------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        values = [int(part.strip()) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive ints such as 1,2,4,8, got {text!r}"
        ) from None
    for v in values:
        positive_int(v, f"every value of {text!r}", error=argparse.ArgumentTypeError)
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a value")
    return sorted(values)


def _workers_per_csx(text: str):
    """``--num-workers-per-csx``: a positive count, or ``auto`` (found while the run runs)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive_int(int(text), "--num-workers-per-csx",
                            error=argparse.ArgumentTypeError)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive int or auto, got {text!r}") from None


def _add_overrides(p: argparse.ArgumentParser, layout: bool = True) -> None:
    g = p.add_argument_group("overrides (replace the experiment file's values)")
    g.add_argument("--steps", type=int, metavar="N", help="steps to run")
    if layout:
        g.add_argument("--num-csx", type=int, metavar="N", help="cs_config.num_csx")
        g.add_argument("--num-workers-per-csx", type=_workers_per_csx, metavar="N|auto",
                       help="cs_config.num_workers_per_csx (auto: found while the run runs, "
                            "within cs_config.autoscale's bounds; the counts settled at are "
                            "printed at the end)")
    g.add_argument("--wafer-samples-per-sec", type=float, metavar="X",
                   help="cs_config.wafer_samples_per_sec (replaces wafer_seconds_per_step)")
    g.add_argument("--wafer-seconds-per-step", type=float, metavar="S",
                   help="cs_config.wafer_seconds_per_step (replaces wafer_samples_per_sec)")
    g.add_argument("--artifact-dir", metavar="DIR", help="where runs and checkpoints are written")
    g.add_argument("--in-process", action="store_true",
                   help="CSX: run the wafer driver and input workers in this process (no Ray; "
                        "input workers then run one after another)")


def _check_overrides(args, command: str) -> None:
    """The override flags' values that must be positive (``run`` also takes the layout's)."""
    from cstream_tools.experiment import ExperimentError

    ints = ["steps"] + (["num_csx"] if command == "run" else [])
    numbers = ["wafer_samples_per_sec", "wafer_seconds_per_step"]
    for names, check in ((ints, positive_int), (numbers, positive_number)):
        for name in names:
            if getattr(args, name) is not None:  # not given: the file's value stays
                check(getattr(args, name), f"--{name.replace('_', '-')}", error=ExperimentError)
    if args.wafer_samples_per_sec is not None and args.wafer_seconds_per_step is not None:
        raise ExperimentError("give --wafer-samples-per-sec or --wafer-seconds-per-step, not both")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def _add_debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true",
                   help="on an error, show the whole exception chain (every traceback, the "
                        "input workers' and the wafer's included); show an embedded Ray's own "
                        "start-up notices and metrics exporter")


def add_parser(subparsers) -> None:
    """Add ``run``, ``sweep`` and ``report`` to the ``cstream`` command's subparsers."""
    _add_run_parser(subparsers)
    _add_sweep_parser(subparsers)
    _add_report_parser(subparsers)


def _add_run_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", formatter_class=_Formatter,
        help="run an experiment file; progress bar, then a summary table",
        description="Run the experiment described by CONFIG (a YAML file, see configs/).\n\n"
                    "Shows the start-up phases (starting Ray, the input workers, tracing,\n"
                    "compiling, the first step) with their times, then a progress bar (step,\n"
                    "loss, samples/s, input-buffer fill), on stderr; prints a summary table (or\n"
                    "with --json only JSON) on stdout. The run's profile (profile.json,\n"
                    "steps.parquet), its timeline (trace.json, see `cstream trace`) and\n"
                    "TensorBoard events are written to ARTIFACT_DIR/executors/NNNNNN/. A run\n"
                    "stopped by Ctrl-C or an error keeps its profile, marked as interrupted,\n"
                    "and prints the partial summary.",
        epilog="example:\n  cstream run configs/digits_mlp.yaml --steps 100\n"
               "  tensorboard --logdir cstream_logs/executors")
    p.add_argument("config", metavar="CONFIG", nargs="?", help="experiment YAML file")
    _add_overrides(p)
    modelzoo_input.add_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON (the only thing written to stdout)")
    _add_debug(p)
    p.set_defaults(func=cmd_run)


def _add_sweep_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", formatter_class=_Formatter,
        help="run an experiment for several worker counts; table and PNG plot",
        description="Run CONFIG once per point of the grid --num-workers-per-csx x --num-csx,\n"
                    "print samples/s, wafer utilisation and input starvation per point, and\n"
                    "write sweep.png (samples/s and utilisation against the worker count) and\n"
                    "sweep.json into --out. sweep.json is written after every point, so an\n"
                    "interrupted sweep keeps the points it finished; --resume continues it.\n"
                    "The smallest worker count that keeps the wafer utilisation >= "
                    f"{UTILISATION_TARGET:.0%} is\nmarked (*); where none does, the table says "
                    "whether more workers would help\n(input-bound) or the machine's cores are "
                    "the limit (machine-bound).",
        epilog="example:\n  cstream sweep configs/input_sleep_150ms.yaml "
               "--num-workers-per-csx 1,2,4,8 --out sw\n"
               "  cstream sweep configs/input_sleep_150ms.yaml --num-workers-per-csx 1,2,4,8 "
               "--out sw --resume\n"
               "  cstream sweep --modelzoo modelzoo/fc_mnist/pytorch/configs/params.yaml "
               "--num-workers-per-csx 1,2,4 --wafer-samples-per-sec 5000")
    p.add_argument("config", metavar="CONFIG", nargs="?", help="experiment YAML file")
    p.add_argument("--num-workers-per-csx", type=_int_list, required=True, metavar="LIST",
                   help="comma-separated worker counts per CS-X, e.g. 1,2,4,8")
    p.add_argument("--num-csx", type=_int_list, default=None, metavar="LIST",
                   help="comma-separated CS-X counts, e.g. 1,2 (default: the file's num_csx)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output folder (default: ARTIFACT_DIR/sweeps/<name>-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out: run only the points its sweep.json lacks")
    p.add_argument("--target", type=float, default=UTILISATION_TARGET, metavar="U",
                   help=f"utilisation to mark the smallest worker count for (default "
                        f"{UTILISATION_TARGET})")
    _add_overrides(p, layout=False)
    modelzoo_input.add_arguments(p)
    sweep_answer.add_arguments(p)
    _add_debug(p)
    p.set_defaults(func=cmd_sweep)


def _add_report_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", formatter_class=_Formatter,
        help="re-print a run's or a sweep's summary and redraw its plots",
        description="RUN_DIR is a run directory (ARTIFACT_DIR/executors/NNNNNN or .../latest):\n"
                    "prints its summary table (marked INTERRUPTED for a run that stopped early)\n"
                    "and writes into it report.png -- per step, the shares of the wafer's time\n"
                    "(compute, input-starved, client-bound; they add to 100%), samples/s over\n"
                    "the last 10 steps and the input-buffer occupancy -- and workers.png (per\n"
                    "input worker: batches/s delivered and its own production rate). For a\n"
                    "sweep folder (one holding sweep.json) it prints the sweep table and\n"
                    "redraws sweep.png.",
        epilog="example:\n  cstream report cstream_logs/executors/latest")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory or sweep folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON, not a table")
    p.set_defaults(func=cmd_report)


# -- shared ----------------------------------------------------------------------------------------
def _experiment(args, command: str):
    """The experiment file of ``args.config`` with the command line's overrides applied."""
    from cstream_tools.experiment import ExperimentError, load_experiment, with_layout

    _check_overrides(args, command)
    if getattr(args, "modelzoo", None):
        exp = modelzoo_input.experiment(args, command)
    elif args.config is None:
        raise ExperimentError("give an experiment file (CONFIG) or a Model Zoo params file "
                              "(--modelzoo PARAMS)")
    else:
        exp = load_experiment(args.config)
    if os.getcwd() not in sys.path:  # import paths in the file resolve from here, as python -m
        sys.path.insert(0, os.getcwd())
    changes = {}
    if command == "run":
        changes = {k: getattr(args, k) for k in ("num_csx", "num_workers_per_csx")
                   if getattr(args, k) is not None}
        if changes.get("num_workers_per_csx") == "auto":  # within the file's bounds if any
            asked = exp.cs_config.autoscale
            if asked is not None:  # asked for on the command line: refused where impossible
                changes["autoscale"] = dataclasses.replace(asked, required=True)
        elif "num_workers_per_csx" in changes:
            changes["autoscale"] = None  # a count given: fixed
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
        backend = dataclasses.replace(
            exp.backend, options=dataclasses.replace(exp.backend.options, in_process=True))
        exp = dataclasses.replace(exp, backend=backend)
    return exp


def _config_errors():
    from cstream_tools.experiment import ExperimentError

    return (ExperimentError, FileNotFoundError)


def _run_failed(command: str, e: BaseException, args) -> int:
    """Exit status (and stderr text) for an exception that ended a run or a sweep: 130 for
    Ctrl-C, 2 for a bad experiment, 1 for anything else, shown as the user's exception."""
    from cstream_tools.cli_errors import format_error
    from cstream_tools.experiment import ExperimentError

    if isinstance(e, KeyboardInterrupt):
        print(f"cstream {command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    if isinstance(e, ExperimentError):
        return _fail(command, str(e), 2)
    if not isinstance(e, Exception):  # SystemExit and the like pass through
        raise e
    print(format_error(command, e, debug=getattr(args, "debug", False)), file=sys.stderr)
    return 1


# -- run -------------------------------------------------------------------------------------------
def _print_result(result, exp, as_json: bool) -> None:
    from executor.report_text import format_summary

    if as_json:
        print(json.dumps({"name": exp.name, "run_dir": str(result.run_dir), **result.report},
                         default=float))
    else:
        print(format_summary(result.report, title=f"{exp.name}: {layout(exp.cs_config)}"))
        print(f"run directory: {result.run_dir}")
        for s in (result.report.get("autoscale") or {}).get("csx", []):
            print(f"input workers of CS-X {s['csx']}: {s['sentence']}")


def cmd_run(args) -> int:
    from cstream_tools.experiment import run_experiment
    from executor.ray_session import show_ray_messages

    show_ray_messages(args.debug)
    try:
        exp = _experiment(args, "run")
    except _config_errors() as e:
        return _fail("run", str(e), 2)
    display = ProgressDisplay(exp.steps, exp.name, enabled=not args.no_progress)
    try:
        result = run_experiment(exp, progress=display)
    except BaseException as e:
        display.close()
        partial = getattr(e, "partial_result", None)
        if partial is not None and partial.run_dir is not None and partial.step_records:
            _print_result(partial, exp, args.json)  # what the run measured before it stopped
        return _run_failed("run", e, args)
    display.close()
    _print_result(result, exp, args.json)
    return 0


def _sweep_plan(args):
    """The experiment and the grid's points of ``cstream sweep``; CLIError or a config error
    for bad arguments."""
    if not 0 < args.target <= 1:
        raise CLIError(f"--target: expected a utilisation in (0, 1], got {args.target}")
    if args.resume and not args.out:
        raise CLIError("--resume continues the sweep in --out DIR; give --out (the folder "
                       "that holds its sweep.json)")
    try:
        sweep_answer.plan_of(args)
    except ValueError as e:
        raise CLIError(str(e)) from None
    exp = _experiment(args, "sweep")
    if getattr(args, "modelzoo", None) and exp.cs_config.wafer_samples_per_sec is None \
            and exp.cs_config.wafer_seconds_per_step is None:
        raise CLIError("--modelzoo: give the wafer's speed to sweep against: "
                       "--wafer-samples-per-sec N, --wafer-rates YAML (your measured rates by "
                       "model name) or --measure-step")
    csx = args.num_csx or [exp.cs_config.num_csx]
    return exp, sweep_points(exp, args.num_workers_per_csx, csx)


def cmd_sweep(args) -> int:
    from executor.ray_session import show_ray_messages

    show_ray_messages(args.debug)
    try:
        exp, points = _sweep_plan(args)
    except (CLIError, *_config_errors()) as e:
        return _fail("sweep", str(e), 2)
    out = Path(args.out) if args.out else (
        Path(exp.artifact_dir) / "sweeps" / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    sweep_file = out / "sweep.json"
    try:
        rows = earlier_rows(args, out, sweep_file)
    except CLIError as e:
        return _fail("sweep", str(e), 2)
    out.mkdir(parents=True, exist_ok=True)
    record = SweepRecord(args, exp, points, sweep_file, rows)
    try:
        run_points(points, record, out)
    except BaseException as e:
        sweep_interrupted(args, record, len(points), out)
        return _run_failed("sweep", e, args)
    doc = record.write(complete=True)
    lines = sweep_answer.answer_lines(doc["answer"])
    png = plot_sweep(doc["rows"], args.target, out / "sweep.png", record.title, lines)
    print(sweep_table(doc["rows"], args.target))
    print("\n".join(lines))
    print(f"plot: {png}")
    print(f"sweep folder: {out}")
    return 0


# -- report ----------------------------------------------------------------------------------------
def cmd_report(args) -> int:
    from cstream_tools.cli_plots import plot_run, plot_workers
    from executor.report import summarize_profile
    from executor.report_text import format_summary
    from executor.report_writers import load_run

    run_dir = Path(args.run_dir)
    try:
        if (run_dir / "sweep.json").is_file():
            try:
                doc = json.loads((run_dir / "sweep.json").read_text())
                rows, target = doc["rows"], float(doc["target"])
            except (ValueError, KeyError) as e:
                raise CLIError(f"{run_dir / 'sweep.json'} is not a sweep record ({e})") from None
            if not rows:
                raise CLIError(f"{run_dir / 'sweep.json'} holds no finished point yet; continue "
                               "the sweep with cstream sweep ... --resume")
            lines = sweep_answer.answer_lines(doc.get("answer"))
            png = plot_sweep(rows, target, run_dir / "sweep.png", doc.get("title", doc["name"]),
                             lines)
            if args.json:
                print(json.dumps(doc, default=float))
            else:
                print(sweep_table(rows, target))
                if lines:
                    print("\n".join(lines))
                if not doc.get("complete", True):
                    print(f"incomplete sweep: {len(rows)} of {len(doc.get('grid', rows))} points; "
                          "continue it with cstream sweep ... --resume")
                print(f"plot: {png}")
            return 0
        profile = load_run(run_dir)
        report = summarize_profile(profile)
    except (CLIError, FileNotFoundError, ValueError) as e:
        return _fail("report", str(e), 2)
    cs = profile.get("cs_config") or {}
    title = f"{profile.get('name') or 'run'} (run {run_dir.resolve().name})"
    if cs and report.get("utilisation") is not None:  # a wafer run
        from workers.config import CSConfig

        title += f": {layout(CSConfig(**cs))}"
    png = plot_run(profile, report, run_dir / "report.png", title)
    workers_png = plot_workers(report, run_dir / "workers.png", title)
    if args.json:
        print(json.dumps(report, default=float))
    else:
        print(format_summary(report, title=title))
        print(f"plot: {png}")
        if workers_png is not None:
            print(f"workers plot: {workers_png}")
    return 0
