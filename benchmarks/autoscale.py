"""Autoscaling: from 1 input worker, how fast does a run find the workers a wafer needs, and
is it the count ``cstream sweep`` answers?

The pipeline: a DataExecutor on the CSX backend, one CS-X, a ``torch.utils.data.DataLoader``
drawing global batches from a ``ShardedSampler``; reading a batch waits ``BATCH_WAIT_S``
(``time.sleep``: I/O-like, so the workers overlap on any number of cores). One worker then
produces about ``1 / BATCH_WAIT_S`` batches/s. The simulated wafer is paced
(``CSConfig.wafer_seconds_per_step``) to need ``k`` workers: it takes ``(k - 0.25)`` workers'
worth of batches per second, so ``k - 1`` starve it and ``k`` do not.

For each ``k`` in ``--needs``:

* an autoscaled run (``num_workers_per_csx="auto"``, starting at 1): the step and the wafer's
  seconds at which the count last changed (settled), the count it settled at, the wafer's
  utilisation from the first settled window to the end, and the worker count over the steps;
* fixed-count runs of the same pipeline at the counts of a sweep grid around ``k``, and
  ``cstream sweep``'s answer from them (:func:`cstream_tools.sweep.best_counts`: the fewest
  workers whose utilisation reaches 95 %).

Writes ``benchmarks/results/autoscale.json`` and ``autoscale.png`` (worker count over steps).

    python -m benchmarks.autoscale [--needs 1,2,4,8] [--steps 900] [--plot-only]
    python -m benchmarks.autoscale --needs 8 --steps 3000 --keep   # one case again, longer

``--keep`` keeps the cases of the results file that this run does not make (each case
records its own number of steps).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import torch  # noqa: E402
from torch.utils.data import BatchSampler, Dataset, SequentialSampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

import cstream as cstorch  # noqa: E402
from benchmarks.bench_data import save_results  # noqa: E402
from benchmarks.machine import describe  # noqa: E402

BATCH_WAIT_S = 0.04
SAMPLES = 4
TARGET = 0.95


class WaitingReads(Dataset):
    """Sample ``i`` is ``i``; a batch's read waits ``BATCH_WAIT_S``."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.tensor([float(i)])


def _collate(samples):
    time.sleep(BATCH_WAIT_S)
    return torch.stack(samples)


def input_fn():
    data = WaitingReads()
    batches = BatchSampler(SequentialSampler(data), batch_size=SAMPLES, drop_last=True)
    return torch.utils.data.DataLoader(data, collate_fn=_collate,
                                       batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def wafer_step_s(need: int) -> float:
    """The wafer's step time that ``need`` workers feed and ``need - 1`` do not."""
    return BATCH_WAIT_S / (need - 0.25)


def run(workers, steps: int, need: int) -> dict:
    """One run's figures: the report, the worker count per step, wall time per step."""
    backend = cstorch.backend("CSX", artifact_dir=tempfile.mkdtemp(prefix="cstream-bench-"))
    try:
        cfg = cstorch.utils.CSConfig(num_workers_per_csx=workers,
                                     wafer_seconds_per_step=wafer_step_s(need))
        executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn),
                                                   num_steps=steps, cs_config=cfg)
        for _ in executor:
            pass
    finally:
        backend.shutdown()
    profile = json.loads((executor.run_dir / "profile.json").read_text())
    report = profile["report"]
    wafer_t = [r["wafer_t"] for r in profile["steps"]]
    return {"report": report, "wafer_t": wafer_t,
            "counts": [(r.get("num_workers") or [workers])[0] for r in profile["steps"]]}


def grid(need: int) -> list[int]:
    """The fixed counts of the sweep: cstream sweep's usual 1, 2, 4, 8 and the neighbours of
    ``need``."""
    return sorted({w for w in (1, 2, 4, 8, need - 1, need, need + 1) if 1 <= w <= need + 1})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--needs", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--sweep-steps", type=int, default=150)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "autoscale.json"))
    p.add_argument("--plot-only", action="store_true")
    p.add_argument("--keep", action="store_true",
                   help="keep the results file's cases of other needs")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    from cstream_tools.sweep import best_counts
    from executor.ray_session import ensure_ray

    ensure_ray()
    needs = [int(x) for x in args.needs.split(",")]
    kept = [c for c in json.loads(out.read_text())["cases"] if c["need"] not in needs] \
        if args.keep and out.exists() else []
    cases = []
    for need in needs:
        auto = run("auto", args.steps, need)
        a = auto["report"]["autoscale"]["csx"][0]
        changed = a["changed_at"]
        rows = []
        for w in grid(need):
            r = run(w, args.sweep_steps, need)["report"]
            rows.append({"num_csx": 1, "num_workers_per_csx": w,
                         "utilisation": r["utilisation"]})
        case = {
            "need": need, "steps": args.steps, "wafer_step_s": wafer_step_s(need),
            "settled_workers": a["workers"], "phase": a["phase"],
            "settle_step": changed,
            "settle_wafer_s": auto["wafer_t"][changed - 1] if changed else 0.0,
            "settled_since_step": a["settled_since"],
            "utilisation_after_settling": a["busy_since_settled"],
            "utilisation_whole_run": auto["report"]["utilisation_incl_warmup"],
            "decisions": [(d["step"], d["action"], d["count"] or d["workers"])
                          for d in auto["report"]["autoscale"]["decisions"]],
            "last_reason": a["reason"],
            "sweep": rows, "sweep_answer": best_counts(rows, TARGET)[1],
            "counts": auto["counts"],
            "load_average_at_end": list(os.getloadavg()),  # what else the machine ran meanwhile
        }
        cases.append(case)
        print(json.dumps({k: v for k, v in case.items() if k != "counts"}, default=float),
              flush=True)
        doc = {"benchmark": "autoscale", "batch_wait_s": BATCH_WAIT_S,
               "sweep_steps": args.sweep_steps, "target": TARGET,
               "cases": sorted(kept + cases, key=lambda c: c["need"]),
               "machine": describe()}
        save_results(doc, out, plot)  # after every case: an interrupted run keeps them


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for case in doc["cases"]:
        line, = ax.plot(range(1, len(case["counts"]) + 1), case["counts"],
                        label=f"wafer needs {case['need']} (sweep says "
                              f"{case['sweep_answer']})")
        if case["sweep_answer"]:
            ax.axhline(case["sweep_answer"], color=line.get_color(), linestyle=":",
                       linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("input workers (CS-X 0)")
    ax.set_title(f"autoscaling from 1 worker, {1000 * doc['batch_wait_s']:g} ms per batch "
                 f"(dotted: cstream sweep's answer)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
