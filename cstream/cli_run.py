"""``cstream run``, ``cstream sweep`` and ``cstream report``: experiments from the command line.

``add_parser(subparsers)`` adds the three subcommands to the ``cstream`` command's parser
(:mod:`cstream.cli`); each subcommand's function returns the process exit status (0 ok, 1 the
run or its files failed, 2 bad arguments or a bad experiment file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from cstream import modelzoo_input, sweep_answer
from workers.checks import positive_int, positive_number

UTILISATION_TARGET = 0.95


class CliError(Exception):
    """A user mistake reported as one line, exit status 2."""


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


def _add_overrides(p: argparse.ArgumentParser, layout: bool = True) -> None:
    g = p.add_argument_group("overrides (replace the experiment file's values)")
    g.add_argument("--steps", type=int, metavar="N", help="steps to run")
    if layout:
        g.add_argument("--num-csx", type=int, metavar="N", help="cs_config.num_csx")
        g.add_argument("--num-workers-per-csx", type=int, metavar="N",
                       help="cs_config.num_workers_per_csx")
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
    from cstream.experiment import ExperimentError

    ints = ["steps"] + (["num_csx", "num_workers_per_csx"] if command == "run" else [])
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
    import dataclasses

    from cstream.experiment import ExperimentError, load_experiment, with_layout

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
    from cstream.experiment import ExperimentError

    return (ExperimentError, FileNotFoundError)


def _run_failed(command: str, e: BaseException, args) -> int:
    """Exit status (and stderr text) for an exception that ended a run or a sweep: 130 for
    Ctrl-C, 2 for a bad experiment, 1 for anything else, shown as the user's exception."""
    from cstream.cli_errors import format_error
    from cstream.experiment import ExperimentError

    if isinstance(e, KeyboardInterrupt):
        print(f"cstream {command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    if isinstance(e, ExperimentError):
        return _fail(command, str(e), 2)
    if not isinstance(e, Exception):  # SystemExit and the like pass through
        raise e
    print(format_error(command, e, debug=getattr(args, "debug", False)), file=sys.stderr)
    return 1


# -- progress --------------------------------------------------------------------------------------
def _rich_phase_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class PhaseColumn(ProgressColumn):
        """The start-up phase under way with its elapsed time; then the run's figures."""

        def render(self, task):
            current = task.fields.get("phase")
            if current is not None:
                name, t0 = current
                return Text(f"{name} ... {time.perf_counter() - t0:.1f} s", style="cyan")
            return Text(task.fields.get("info", ""))

    return PhaseColumn()


class _ProgressDisplay:
    """Progress on stderr, so that stdout holds only the result (the table, or JSON).

    Start-up phases (:mod:`executor.phases`: starting Ray, the wafer driver, the input workers,
    tracing, compiling, the first step) are shown as they run and with their times when they
    end. On a terminal: a rich progress bar; elsewhere a line per finished phase and a line
    every tenth of the run, each with the figures of the step it names.
    """

    def __init__(self, total: int, name: str, enabled: bool):
        from executor import phases

        self.total = total
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._bar = None
        self._next_line = 1
        self._stop_listening = phases.listen(self._phase) if enabled else None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            from rich.progress import TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), _rich_phase_column(),
                                 TimeElapsedColumn(), console=Console(stderr=True),
                                 transient=False)
            self._task = self._bar.add_task(name, total=total, info="", phase=None)
            self._bar.start()

    def _phase(self, event: str, name: str, elapsed_s: float) -> None:
        if event == "start":
            if self._bar is not None:
                self._bar.update(self._task, phase=(name, time.perf_counter()))
            return
        line = f"{name}: {elapsed_s:.2f} s"
        if self._bar is not None:
            self._bar.update(self._task, phase=None)
            self._bar.console.print(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def wants(self, step: int) -> bool:
        """Whether step ``step`` (from 1) will be shown: its figures are then fetched for it."""
        return self.enabled and self._bar is None and (step >= self._next_line
                                                       or step == self.total)

    @staticmethod
    def _info(p) -> str:
        loss = "-" if p.loss is None else f"{p.loss:.4f}"
        if p.loss is not None and p.loss_step is not None and p.loss_step != p.step:
            loss += f" (step {p.loss_step})"
        rate = "-" if p.rate is None else f"{p.rate:,.1f}"
        fill = "-" if p.buffer_fill is None else f"{p.buffer_fill:.1f}"
        return f"loss {loss}  rate {rate} samples/s  buffer {fill} batches ready"

    def __call__(self, p) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=p.step, info=self._info(p))
        elif p.step >= self._next_line or p.step == p.num_steps:
            print(f"step {p.step}/{p.num_steps}  {self._info(p)}", file=sys.stderr, flush=True)
            self._next_line = p.step + max(1, p.num_steps // 10)

    def close(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# -- run -------------------------------------------------------------------------------------------
def _print_result(result, exp, as_json: bool) -> None:
    from executor.report import format_summary

    if as_json:
        print(json.dumps({"name": exp.name, "run_dir": str(result.run_dir), **result.report},
                         default=float))
    else:
        print(format_summary(result.report, title=f"{exp.name}: {_layout(exp.cs_config)}"))
        print(f"run directory: {result.run_dir}")


def cmd_run(args) -> int:
    from cstream.experiment import run_experiment
    from executor.ray_session import show_ray_messages

    show_ray_messages(args.debug)
    try:
        exp = _experiment(args, "run")
    except _config_errors() as e:
        return _fail("run", str(e), 2)
    display = _ProgressDisplay(exp.steps, exp.name, enabled=not args.no_progress)
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


def _layout(cs) -> str:
    wafer = ("as fast as the step runs" if cs.wafer_samples_per_sec is None
             and cs.wafer_seconds_per_step is None else
             f"{cs.wafer_samples_per_sec:g} samples/s per CS-X" if cs.wafer_samples_per_sec
             is not None
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
    from cstream.cli_plots import plot_sweep as draw

    return draw(rows, target, path, title, best_counts(rows, target), note=note)


SWEEP_ROW_KEYS = ("samples_per_s", "global_rate", "utilisation", "starved_fraction",
                  "client_bound_fraction", "mean_buffer_occupancy", "worker_rate_spread",
                  "input_cpu_cores", "machine_cpus", "time_to_first_step_s", "wafer_wall_s",
                  "steps", "samples")


def _sweep_row(exp, result) -> dict:
    return {"num_csx": exp.cs_config.num_csx,
            "num_workers_per_csx": exp.cs_config.num_workers_per_csx,
            "buffer_batches": exp.cs_config.input_buffer_batches,
            "run_dir": str(result.run_dir), **{k: result.report.get(k) for k in SWEEP_ROW_KEYS},
            **sweep_answer.worker_figures(result.report)}


def _write_sweep(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float))
    os.replace(tmp, path)


class _SweepRecord:
    """The sweep's ``sweep.json``: the grid, the experiment and the rows measured so far."""

    def __init__(self, args, exp, points: list, path: Path, rows: list[dict]):
        self.args, self.exp, self.path = args, exp, path
        self.title = f"{exp.name}: {_layout(points[0].cs_config).split(', ', 1)[1]}"
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


def _sweep_plan(args):
    """The experiment and the grid's points of ``cstream sweep``; CliError or a config error
    for bad arguments."""
    if not 0 < args.target <= 1:
        raise CliError(f"--target: expected a utilisation in (0, 1], got {args.target}")
    if args.resume and not args.out:
        raise CliError("--resume continues the sweep in --out DIR; give --out (the folder "
                       "that holds its sweep.json)")
    try:
        sweep_answer.plan_of(args)
    except ValueError as e:
        raise CliError(str(e)) from None
    exp = _experiment(args, "sweep")
    if getattr(args, "modelzoo", None) and exp.cs_config.wafer_samples_per_sec is None \
            and exp.cs_config.wafer_seconds_per_step is None:
        raise CliError("--modelzoo: give the wafer's speed to sweep against: "
                       "--wafer-samples-per-sec N, --wafer-rates YAML (your measured rates by "
                       "model name) or --measure-step")
    csx = args.num_csx or [exp.cs_config.num_csx]
    return exp, sweep_points(exp, args.num_workers_per_csx, csx)


def _earlier_rows(args, out: Path, sweep_file: Path) -> list[dict]:
    """The rows a resumed sweep measured before; CliError where --resume and --out disagree
    with what the folder holds."""
    if not sweep_file.is_file():
        if args.resume:
            raise CliError(f"--resume: {out} holds no sweep.json to continue; run the sweep "
                           "without --resume first.")
        return []
    if not args.resume:
        raise CliError(f"{out} already holds a sweep ({sweep_file}); pass --resume to "
                       "continue it, or choose another --out.")
    try:
        return list(json.loads(sweep_file.read_text())["rows"])
    except (ValueError, KeyError) as e:
        raise CliError(f"{sweep_file} is not a sweep record ({e}); remove it or "
                       "choose another --out.") from None


def _run_points(points: list, record: _SweepRecord, out: Path) -> None:
    """Run every point of the grid not measured yet, writing ``sweep.json`` after each; Ray is
    started once for them all (and stopped after, if this started it)."""
    from cstream.experiment import run_experiment

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
            record.rows.append(_sweep_row(point, result))
            record.write(complete=False)
    finally:
        if ray_started:
            import ray

            ray.shutdown()


def _sweep_interrupted(args, record: _SweepRecord, num_points: int, out: Path) -> None:
    """Keep the points measured, show them, and say how to continue."""
    doc = record.write(complete=False)
    if doc["rows"]:
        print(sweep_table(doc["rows"], args.target))
    print(f"sweep interrupted after {len(doc['rows'])} of {num_points} points; "
          f"{record.path} keeps them. Continue with: cstream sweep {args.config} "
          f"--num-workers-per-csx {','.join(map(str, args.num_workers_per_csx))}"
          + (f" --num-csx {','.join(map(str, args.num_csx))}" if args.num_csx else "")
          + f" --out {out} --resume", flush=True)


def cmd_sweep(args) -> int:
    from executor.ray_session import show_ray_messages

    show_ray_messages(args.debug)
    try:
        exp, points = _sweep_plan(args)
    except (CliError, *_config_errors()) as e:
        return _fail("sweep", str(e), 2)
    out = Path(args.out) if args.out else (
        Path(exp.artifact_dir) / "sweeps" / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    sweep_file = out / "sweep.json"
    try:
        rows = _earlier_rows(args, out, sweep_file)
    except CliError as e:
        return _fail("sweep", str(e), 2)
    out.mkdir(parents=True, exist_ok=True)
    record = _SweepRecord(args, exp, points, sweep_file, rows)
    try:
        _run_points(points, record, out)
    except BaseException as e:
        _sweep_interrupted(args, record, len(points), out)
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
    from cstream.cli_plots import plot_run, plot_workers
    from executor.report import format_summary, load_run, summarize_profile

    run_dir = Path(args.run_dir)
    try:
        if (run_dir / "sweep.json").is_file():
            try:
                doc = json.loads((run_dir / "sweep.json").read_text())
                rows, target = doc["rows"], float(doc["target"])
            except (ValueError, KeyError) as e:
                raise CliError(f"{run_dir / 'sweep.json'} is not a sweep record ({e})") from None
            if not rows:
                raise CliError(f"{run_dir / 'sweep.json'} holds no finished point yet; continue "
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
    except (CliError, FileNotFoundError, ValueError) as e:
        return _fail("report", str(e), 2)
    cs = profile.get("cs_config") or {}
    title = f"{profile.get('name') or 'run'} (run {run_dir.resolve().name})"
    if cs and report.get("utilisation") is not None:  # a wafer run
        from workers.config import CSConfig

        title += f": {_layout(CSConfig(**cs))}"
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
