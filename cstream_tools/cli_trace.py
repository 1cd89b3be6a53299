"""``cstream trace RUN_DIR``: where a run's timeline is and how to open it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cstream_tools.cli_errors import CLIError
from workers.checks import positive_number


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "trace", help="where a run's timeline (Chrome/Perfetto trace) is and how to open it",
        description="Every run writes trace.json into its run directory: a timeline in the "
                    "Chrome trace-event format with each input worker's batch production and "
                    "transfers, the wafer's steps and input waits, and the client's steps, "
                    "closures and start-up phases. This prints where it is, what it holds and "
                    "how to open it (for a run written before trace.json existed, it is built "
                    "from profile.json).",
        epilog="example:\n  cstream trace cstream_logs/executors/latest")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (.../executors/NNNNNN)")
    p.add_argument("--png", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                   help="also draw timeline.png: SECONDS (default 2) of the timeline from the "
                        "wafer's second step, one row per track")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args) -> int:
    from executor.report_writers import load_run
    from executor.timeline import write_trace

    run_dir = Path(args.run_dir)
    path = run_dir / "trace.json"
    if not path.is_file():
        write_trace(path, load_run(run_dir))  # FileNotFoundError names what is missing
    try:
        events = json.loads(path.read_text())["traceEvents"]
    except (ValueError, KeyError) as e:
        raise CLIError(f"{path} is not a trace-event file ({e}); delete it and run "
                       f"cstream trace {run_dir} to rebuild it from profile.json") from None
    spans = Counter(e["name"] if e["name"] in ("produce", "transfer", "compute", "input wait")
                    else "client" if e["pid"] == 1 else "other"
                    for e in events if e.get("ph") == "X")
    workers = {(e["pid"], e["tid"]) for e in events if e.get("name") == "produce"}
    print(f"trace: {path}")
    print(f"  {len(workers)} input workers: {spans['produce']} batch productions, "
          f"{spans['transfer']} transfers")
    print(f"  wafer: {spans['compute']} steps, {spans['input wait']} input waits")
    print(f"  client: {spans['client']} spans (steps, closures, start-up phases)")
    print("open it: https://ui.perfetto.dev -> Open trace file (the file stays on this machine), "
          "or chrome://tracing -> Load")
    if args.png is not None:
        positive_number(args.png, "--png", error=CLIError,
                        fix="Give the seconds of the timeline to draw, e.g. --png 2.")
        from cstream_tools.cli_plots import plot_timeline

        doc = json.loads(path.read_text())
        name = (doc.get("otherData") or {}).get("name") or "run"
        png = plot_timeline(doc, run_dir / "timeline.png", f"{name} (run "
                            f"{run_dir.resolve().name}): {args.png:g} s of the timeline",
                            seconds=args.png)
        print(f"timeline plot: {png}")
    return 0
