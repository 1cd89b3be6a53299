"""What glibc's heap costs a training step run in the user's own process.

By default glibc serves a block over 128 KiB from pages of its own (``mmap``) and hands the free
top of its heap back to the kernel, so a loop that frees its step's buffers faults their pages in
again on the next step. cstream keeps that memory wherever it runs a step
(:mod:`executor.wafer.heap`): in its Ray driver, and in the user's process for
``cstream.backend("CPU")`` and ``cstream.backend("CSX", in_process=True)``. This benchmark runs
those two and eager PyTorch with each heap, the seed's loop with a step closure every step, each
run in its own process (``train_throughput.py --child``), the variants interleaved over
``--rounds`` rounds, medians (inductor's program is compiled into the compile cache first, as a
second run of a script finds it):

* ``default``: glibc's defaults (``CSTREAM_KEEP_FREED_MEMORY=0`` for cstream);
* ``kept``: cstream's setting: cstream's own default; for eager PyTorch the same values given
  through ``GLIBC_TUNABLES``, as a user would set them.

    python -m benchmarks.heap            # about 10 minutes on 2 cores
    python -m benchmarks.heap --quick    # one round, short runs

Writes ``benchmarks/results/heap.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

from benchmarks import train_throughput as tt  # noqa: E402
from benchmarks.machine import describe, revision  # noqa: E402

from executor.wafer.heap import MMAP_THRESHOLD_BYTES, OPT_OUT, TRIM_THRESHOLD_BYTES  # noqa: E402

KEPT_FOR_EAGER = {"GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}:"
                                    f"glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}"}
MODELS = ["mlp_784_512_512_10_b64", "transformer_lm_2x128_seq64_b8"]
VARIANTS = {"eager": {}, "cpu_backend": {}, "csx_in_process": {"in_process": True}}
HEAPS = ["default", "kept"]


def heap_env(variant: str, heap: str) -> dict:
    """The environment that gives ``variant`` the ``heap`` (see the module's text)."""
    if variant == "eager":
        return KEPT_FOR_EAGER if heap == "kept" else {}
    return {OPT_OUT: "0"} if heap == "default" else {}


def train_spec(tmp: str, model: str, variant: str, steps: int, options: dict) -> dict:
    """One ``train_throughput.py --child`` run: a closure every step, the model's compile cache."""
    return {"kind": "train", "model": model, "variant": variant, "closure": True, "steps": steps,
            "artifact_dir": f"{tmp}/art", "compile_dir": f"{tmp}/compile_{model}",
            "csx_options": options}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one round of short runs")
    p.add_argument("--out", default=str(HERE / "results" / "heap.json"))
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    steps = tt.QUICK_TRAIN_STEPS if args.quick else tt.TRAIN_STEPS
    runs: dict = {m: {v: {h: [] for h in HEAPS} for v in VARIANTS} for m in MODELS}
    with tempfile.TemporaryDirectory() as tmp:
        for m in MODELS:  # inductor's program compiled ahead: the in-process runs tier up to it
            warm = tt.launch(train_spec(tmp, m, "csx_inductor", 20,
                                        {"in_process": True, "compiler": "inductor"}), 600.0)
            if "error" in warm:
                print(f"compiling inductor's program for {m} failed ({warm['error']}): its "
                      "in-process runs may stay on fx", flush=True)
        for r in range(rounds):
            for m in MODELS:
                for v, options in VARIANTS.items():
                    for h in HEAPS:
                        res = tt.launch(train_spec(tmp, m, v, steps[m], options), 600.0,
                                        env=heap_env(v, h))
                        runs[m][v][h].append(res)
                        figure = res.get("steps_per_s")
                        print(f"round {r + 1} {m} {v} heap {h}: "
                              f"{'%.1f steps/s' % figure if figure else res.get('error')}",
                              flush=True)
    table = {}
    for m in MODELS:
        eager = statistics.median(x["steps_per_s"] for x in runs[m]["eager"]["default"])
        table[m] = {}
        for v in VARIANTS:
            for h in HEAPS:
                got = [x["steps_per_s"] for x in runs[m][v][h] if x.get("steps_per_s")]
                med = statistics.median(got) if got else None
                table[m][f"{v}/{h}"] = {"steps_per_s": med, "samples": got,
                                        "ratio_to_eager": med / eager if med else None}
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git": revision(), "machine": describe(), "rounds": rounds,
           "quick": args.quick, "kept_env_for_eager": KEPT_FOR_EAGER, "table": table, "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nsteps/s, closure every step, medians of {rounds} (ratio to eager, default heap):")
    print(f"{'model':32s}" + "".join(f"{v + '/' + h:>26s}" for v in VARIANTS for h in HEAPS))
    for m in MODELS:
        cells = []
        for v in VARIANTS:
            for h in HEAPS:
                c = table[m][f"{v}/{h}"]
                cells.append(f"{c['steps_per_s']:.1f} ({c['ratio_to_eager']:.2f}x)"
                             if c["steps_per_s"] else "-")
        print(f"{m:32s}" + "".join(f"{c:>26s}" for c in cells))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
