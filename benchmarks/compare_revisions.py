"""The input and training benchmarks on two revisions of the library, alternating, on one machine.

Each revision is checked out into its own git worktree, and today's ``benchmarks/`` folder is
copied over both, so the measuring code is the same and only the library differs. Every round
runs each benchmark once per revision, the order of the revisions swapped every round
(A B, B A, A B, ...), each in its own process; the medians over the rounds are compared.

The benchmarks and the figures read from their results (short settings, so a round takes a
few minutes on 2 cores):

* ``input_scaling.py --quick --rounds 1``: ``global_rate`` over torch's DataLoader, per
  worker count and run length;
* ``stragglers.py --rounds 1 --steps 400``: the wafer's utilisation and the fraction of the
  workers' rates, static and dynamic, per case;
* ``multinode.py --rounds 1 --workers 4,8 --batches-per-worker 60``: batches/s and efficiency;
* ``train_throughput.py --rounds 1 --models mlp_784_512_512_10_b64
  --sections training,consumption``: steps/s of each variant with a closure every step, and
  the consumption ceiling's batches/s.

Writes ``benchmarks/results/compare_revisions.json`` and prints one table.

    python -m benchmarks.compare_revisions --before REV [--after HEAD] [--rounds 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

from benchmarks.machine import describe  # noqa: E402

# name -> (script, arguments, where the script writes: "out" (its --out) or a file name next to it)
BENCHMARKS = {
    "input_scaling": ("input_scaling.py", ["--quick", "--rounds", "1"], "input_scaling_quick.json"),
    "stragglers": ("stragglers.py", ["--rounds", "1", "--steps", "400"], "out"),
    "multinode": ("multinode.py", ["--rounds", "1", "--workers", "4,8",
                                   "--batches-per-worker", "60"], "out"),
    "train_throughput": ("train_throughput.py",
                         ["--rounds", "1", "--models", "mlp_784_512_512_10_b64",
                          "--sections", "training,consumption"], "out"),
}


def figures(name: str, result: dict) -> dict:
    """The figures compared, keyed by a readable label."""
    out = {}
    if name == "input_scaling":
        for key, row in result["model_comparison"].items():
            out[f"global_rate / DataLoader, {key}"] = row["cstream_vs_torch"]
    elif name == "stragglers":
        for case, row in result["cases"].items():
            for mode in ("static", "dynamic"):
                out[f"{case} {mode}: utilisation"] = row[mode]["utilisation"]
                out[f"{case} {mode}: fraction of worker rates"] = \
                    row[mode]["fraction_of_worker_rates"]
    elif name == "multinode":
        for row in result["medians"]:
            out[f"{row['workers']} workers: batches/s"] = row["batches_per_s"]
            out[f"{row['workers']} workers: efficiency"] = row["efficiency"]
    elif name == "train_throughput":
        for model, closures in result["training"].items():
            for variant, row in closures["with_closure"].items():
                out[f"{model} {variant}: steps/s"] = row["steps_per_s"]
        for variant, row in result.get("consumption", {}).items():
            out[f"consumption {variant}: batches/s"] = row["batches_per_s"]
    return out


def checkout(rev: str, where: Path) -> str:
    """A worktree of ``rev`` at ``where`` with today's benchmarks; its commit."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
                   check=True, capture_output=True)
    shutil.rmtree(where / "benchmarks")
    shutil.copytree(HERE, where / "benchmarks",
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
    (where / "benchmarks" / "results").mkdir()
    return subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()


def run_one(tree: Path, name: str, timeout_s: float) -> dict:
    script, args, writes = BENCHMARKS[name]
    out = tree / "benchmarks" / "results" / f"{name}.json"
    # every benchmark takes --out; input_scaling --quick writes its file beside it
    cmd = [sys.executable, "-m", f"benchmarks.{Path(script).stem}", *args, "--out", str(out)]
    target = out if writes == "out" else out.with_name(writes)
    target.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not target.exists():
        tail = (proc.stdout + proc.stderr)[-2000:]
        return {"error": f"{script} exited with {proc.returncode}: {tail}", "wall_s": wall}
    return {"figures": figures(name, json.loads(target.read_text())), "wall_s": wall}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the revision measured as 'before'")
    p.add_argument("--after", default="HEAD", help="the revision measured as 'after'")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--benchmarks", default=",".join(BENCHMARKS),
                   help="a comma-separated subset of: " + ", ".join(BENCHMARKS))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark run")
    p.add_argument("--out", default=str(HERE / "results" / "compare_revisions.json"))
    args = p.parse_args(argv)
    names = [n.strip() for n in args.benchmarks.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    tmp = Path(tempfile.mkdtemp(prefix="cstream-compare-"))
    sides = {"before": tmp / "before", "after": tmp / "after"}
    commits = {}
    runs: dict = {side: {n: [] for n in names} for side in sides}
    try:
        commits = {side: checkout(getattr(args, side), path) for side, path in sides.items()}
        print(f"before: {commits['before']}, after: {commits['after']}", flush=True)
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in names:
                for side in order:
                    res = run_one(sides[side], name, args.timeout)
                    runs[side][name].append(res)
                    print(f"  round {r + 1} {name} {side}: "
                          f"{res.get('error', '')[:300] or 'ok'} ({res['wall_s']:.0f} s)",
                          flush=True)
    finally:
        for path in sides.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    table = {}
    for name in names:
        keys = []
        for side in sides:
            for res in runs[side][name]:
                keys += [k for k in res.get("figures", {}) if k not in keys]
        for key in keys:
            row = {}
            for side in sides:
                vals = [res["figures"][key] for res in runs[side][name]
                        if key in res.get("figures", {}) and res["figures"][key] is not None]
                row[side] = statistics.median(vals) if vals else None
                row[f"{side}_samples"] = vals
            row["after_over_before"] = (row["after"] / row["before"]
                                        if row["before"] and row["after"] is not None else None)
            table[f"{name}: {key}"] = row
    width = max((len(k) for k in table), default=10)
    print(f"\n{'figure':{width}s}  {'before':>10s}  {'after':>10s}  after/before")
    for key, row in table.items():
        b, a, q = row["before"], row["after"], row["after_over_before"]
        print(f"{key:{width}s}  {b if b is None else f'{b:10.3f}'}  "
              f"{a if a is None else f'{a:10.3f}'}  {'' if q is None else f'{q:.3f}'}")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": describe(), "loadavg_end": list(os.getloadavg()),
              "commits": commits, "rounds": args.rounds, "table": table,
              "errors": {side: {n: [x["error"] for x in runs[side][n] if "error" in x]
                                for n in names} for side in sides}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
