"""Where a training step's CPU time goes, process by process, as users run it.

One model of ``train_throughput.py`` (default the MLP 784-512-512-10, batch 64, closure every
step) is trained by ``train_throughput.py --child`` in its own process, eager and on the CSX
default path (client, Ray driver actor, 2 input workers), interleaved over ``--rounds``
rounds. While a run goes, every thread of the run's processes (the child and every process it
started: Ray's, the driver, the workers) is read from ``/proc`` every 0.25 s. Over the run's
steady steps (30%..90% of them, placed in time by the run's own time to first step and
steps/s) each role's CPU time is divided by the steps run:

- ``wafer compute``: the driver's compute thread and its OpenMP threads;
- ``driver, other threads``: the driver's feeder, coordinator, Ray threads;
- ``input workers``: every thread of the input worker processes;
- ``client``: the user's process (eager: the whole eager run);
- ``Ray system``: raylet and GCS; ``other``: the rest of the run's processes.

Where the CPUs are all busy, a millisecond of CPU taken by anything but the wafer's compute
threads lengthens the step by about a millisecond (the compute threads wait for each other
at every parallel region), so these figures say what the default path pays beside the step.
Each role's wakeups a step (its threads' voluntary context switches) are counted over the
same window: a thread that wakes takes a core from a compute thread, however little it does.
The CSX runs also give the wafer's own compute time a step (the median of the run summary's
``compute_s``), the part of the wall time a step that the wafer spent computing.

Writes ``benchmarks/results/cpu_per_step_<model>.json`` and prints a table (medians over
rounds).

    python -m benchmarks.cpu_per_step [--rounds 3] [--model mlp_784_512_512_10_b64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from benchmarks.bench_data import TRAIN_MODELS  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from benchmarks.train_throughput import RESULT_TAG  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.25
STEADY = (0.30, 0.90)
ROLES = ["wafer compute", "driver, other threads", "input workers", "client", "Ray system",
         "other"]
VARIANTS = ["eager", "csx_default"]


def _stat(pid: str, tid: str) -> tuple[str, int, int]:
    """``(comm, ppid, utime + stime ticks)`` of one thread."""
    s = open(f"/proc/{pid}/task/{tid}/stat").read()
    comm = s[s.index("(") + 1:s.rindex(")")]
    fields = s[s.rindex(")") + 2:].split()
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


def _wakeups(pid: str, tid: str) -> int:
    """How many times one thread gave up its CPU to wait (voluntary context switches)."""
    for line in open(f"/proc/{pid}/task/{tid}/status"):
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def snapshot(root: int) -> dict:
    """Every thread of ``root`` and its descendants: ``(pid, tid) -> (role, ticks, wakeups)``."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm, ppid, _ = _stat(pid, pid)
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except OSError:
            continue
        procs[int(pid)] = (ppid, cmd)
    mine = {root}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                changed = True
    out = {}
    for pid in mine:
        if pid not in procs:
            continue
        cmd = procs[pid][1]
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                comm, _, ticks = _stat(str(pid), tid)
                wakeups = _wakeups(str(pid), tid)
            except OSError:
                continue
            out[(pid, int(tid))] = (role_of(pid, root, cmd, comm), ticks, wakeups)
    return out


def role_of(pid: int, root: int, cmd: str, comm: str) -> str:
    if pid == root:
        return "client"
    if "WaferDriver" in cmd:
        # the compute thread and its OpenMP threads (comm "ray::cstream-wa", cut at 15 chars)
        return "wafer compute" if "cstream-wa" in comm else "driver, other threads"
    if "InputWorker" in cmd:
        return "input workers"
    if "raylet" in cmd or "gcs_server" in cmd:
        return "Ray system"
    return "other"


def cpu_between(snaps: list, t0: float, t1: float) -> dict:
    """Each role's CPU seconds and wakeups between the snapshots nearest ``t0`` and ``t1``,
    and the snapshots' own times."""
    a = min(snaps, key=lambda s: abs(s[0] - t0))
    b = min(snaps, key=lambda s: abs(s[0] - t1))
    cpu, wakeups = dict.fromkeys(ROLES, 0.0), dict.fromkeys(ROLES, 0)
    for key, (role, ticks, woke) in b[1].items():
        _, ticks0, woke0 = a[1].get(key, (role, 0, 0))
        cpu[role] += (ticks - ticks0) * TICK_S
        wakeups[role] += woke - woke0
    return {"t0": a[0], "t1": b[0], "cpu_s": cpu, "wakeups": wakeups}


def run_one(model: str, variant: str, steps: int, work: Path, compile_dir: Path,
            measure: bool = True) -> dict:
    """One training run in its own process; with ``measure``, its CPU and wakeups a step
    over the steady steps, else only the run's own result (a warm-up)."""
    spec = {"kind": "train", "model": model, "variant": variant, "closure": True,
            "steps": steps, "artifact_dir": str(work / "artifacts"),
            "compile_dir": str(compile_dir), "launch_time": time.time()}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, str(HERE / "train_throughput.py"), "--child",
                             json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    snaps = []
    deadline = time.time() + 600
    while proc.poll() is None:
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"{variant}: the run took over 600 s")
        snaps.append((time.time(), snapshot(proc.pid)))
        time.sleep(SAMPLE_S)
    out = proc.stdout.read()
    line = next((x for x in out.splitlines() if x.startswith(RESULT_TAG)), None)
    if line is None:
        raise RuntimeError(f"{variant}: the run printed no result (exit {proc.returncode})")
    result = json.loads(line[len(RESULT_TAG):])
    if not measure:
        return result
    rate = result["steps_per_s"]
    first = spec["launch_time"] + result["time_to_first_step_s"]
    window = cpu_between(snaps, first + STEADY[0] * steps / rate,
                         first + STEADY[1] * steps / rate)
    if window["t1"] <= window["t0"]:
        raise RuntimeError(
            f"{variant}: its steady steps ({STEADY[0]:.0%}-{STEADY[1]:.0%} of {steps}, "
            f"{(STEADY[1] - STEADY[0]) * steps / rate:.2f} s at {rate:.0f} steps/s) fell between "
            f"two of the /proc readings taken every {SAMPLE_S} s: run more steps (--steps)")
    n = rate * (window["t1"] - window["t0"])
    per_step = {r: 1e3 * s / n for r, s in window["cpu_s"].items()}
    wakeups = {r: w / n for r, w in window["wakeups"].items()}
    return {"steps_per_s": rate, "window_s": window["t1"] - window["t0"], "steps_in_window": n,
            "cpu_ms_per_step": per_step, "total_cpu_ms_per_step": sum(per_step.values()),
            "wakeups_per_step": wakeups, "total_wakeups_per_step": sum(wakeups.values()),
            "wall_ms_per_step": 1e3 / rate,
            "wafer_compute_ms": result.get("engine", {}).get("wafer_compute_ms_median")}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="mlp_784_512_512_10_b64", choices=list(TRAIN_MODELS))
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--out", help="default: benchmarks/results/cpu_per_step_<model>.json")
    args = p.parse_args(argv)
    args.out = args.out or str(HERE / "results" / f"cpu_per_step_{args.model}.json")
    runs = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="cpu_per_step_") as tmp:
        work = Path(tmp)
        compile_dir = work / "compile"
        # the inductor artifact in the cache, as train_throughput.py's csx_inductor runs leave
        # it for its csx_default runs (the default path then tiers up to it within ~40 steps)
        run_one(args.model, "csx_inductor", 200, work, compile_dir, measure=False)
        for r in range(args.rounds):
            for v in VARIANTS:
                res = run_one(args.model, v, args.steps, work, compile_dir)
                runs[v].append(res)
                print(f"round {r + 1} {v}: {res['steps_per_s']:.1f} steps/s, "
                      + ", ".join(f"{k} {x:.3f}" for k, x in res["cpu_ms_per_step"].items()
                                  if x) + " ms CPU a step; "
                      + f"{res['total_wakeups_per_step']:.1f} wakeups a step", flush=True)

    def med(rs, key):
        xs = [x[key] for x in rs if x.get(key) is not None]
        return statistics.median(xs) if xs else None

    median = {v: {"steps_per_s": med(rs, "steps_per_s"),
                  "wall_ms_per_step": med(rs, "wall_ms_per_step"),
                  "wafer_compute_ms": med(rs, "wafer_compute_ms"),
                  "total_cpu_ms_per_step": med(rs, "total_cpu_ms_per_step"),
                  "total_wakeups_per_step": med(rs, "total_wakeups_per_step"),
                  "cpu_ms_per_step": {role: statistics.median(x["cpu_ms_per_step"][role]
                                                              for x in rs) for role in ROLES},
                  "wakeups_per_step": {role: statistics.median(x["wakeups_per_step"][role]
                                                               for x in rs) for role in ROLES}}
              for v, rs in runs.items()}
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": describe(),
           "model": args.model, "steps": args.steps, "rounds": args.rounds, "steady": STEADY,
           "median": median, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\n{args.model}, medians of {args.rounds} rounds, CPU ms and wakeups a step:\n")
    print("| role | " + " | ".join(f"{v} CPU ms | {v} wakeups" for v in VARIANTS) + " |")
    print("| --- |" + " --- | --- |" * len(VARIANTS))

    def cell(x, fmt):
        return "—" if x is None else format(x, fmt)

    for row, key, fmt in (("steps/s", "steps_per_s", ".0f"),
                          ("wall ms a step", "wall_ms_per_step", ".3f"),
                          ("wafer compute_s median, ms", "wafer_compute_ms", ".3f")):
        cells = [f"{cell(median[v][key], fmt)} | " for v in VARIANTS]  # its wakeups cell empty
        print(f"| {row} | " + " | ".join(cells) + " |")
    for role in [*ROLES, "all"]:
        cells = []
        for v in VARIANTS:
            m = median[v]
            cpu = m["total_cpu_ms_per_step"] if role == "all" else m["cpu_ms_per_step"][role]
            woke = m["total_wakeups_per_step"] if role == "all" else m["wakeups_per_step"][role]
            cells.append(f"{cell(cpu, '.3f')} | {cell(woke, '.1f')}")
        print(f"| {role} | " + " | ".join(cells) + " |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
