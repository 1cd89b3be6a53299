"""Stragglers: the wafer's utilisation under static (round-robin) and dynamic assignment.

The real cstream path: a DataExecutor on the CSX backend, 4 Ray input workers of one CS-X, the
input_fn's ``torch.utils.data.DataLoader`` drawing global batches from a ``ShardedSampler``.
Reading sample ``i`` costs ``cost[i]`` seconds (``time.sleep``), drawn once from a seeded
lognormal whose p99 is 10x its median; a batch costs the sum of its samples'. The same data,
the same costs, in both modes: only which worker produces which global batch differs.

Three cases, each run in rounds that interleave the modes (medians reported); utilisation and
rates are taken over the steps after the first 10% (start-up, and the look-ahead filling from
empty at the wafer's pace):

* ``heavy_tail``: the simulated wafer is held (``CSConfig.wafer_seconds_per_step``) to 85% of
  the 4 workers' mean capacity (``4 / mean batch cost`` over the batches a run streams).
  Measured: the wafer's utilisation (compute / wall). Defaults otherwise: a static worker may
  run ``CsxInputStream.max_batches_ahead`` batches ahead, and the dynamic reorder window holds
  as many for all workers together (the same bound).
* ``heavy_tail_tight_memory``: the same, with both modes held to the same
  ``CSConfig.input_bytes_in_flight_per_csx`` of 16 batches (4 a worker), as large batches
  would be by the object store.
* ``one_slow_worker``: the same costs, worker 3 twice as slow on every sample. The wafer is
  held to 1.25x the ideal input rate, so the input side sets the pace. Measured: global
  batches/s reaching the wafer against the sum of the workers' rates (each worker's
  ``1 / mean batch cost`` as it measured it); static is capped by the slowest worker
  (``4 x`` its rate, 2/3.5 = 57% of the sum).

Writes ``benchmarks/results/stragglers.json`` and ``stragglers.png``.

    python -m benchmarks.stragglers [--rounds 3] [--steps 700] [--plot-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

import cstream as cstorch  # noqa: E402
from benchmarks.bench_data import save_results  # noqa: E402

WORKERS = 4
BATCH = 1  # samples per global batch
MEDIAN_S = 0.025  # median read cost of one sample
SIGMA = math.log(10) / 2.3263  # lognormal sigma with p99 = 10 x median
NUM_SAMPLES = 8192
SEED = 16
SLOW_WORKER = 3
SAMPLE_FLOATS = 64 * 1024
TIGHT_BATCHES = 16  # heavy_tail_tight_memory: batches in flight per CS-X (4 a worker)


def read_costs(n: int = NUM_SAMPLES, seed: int = SEED) -> torch.Tensor:
    """Seconds to read each sample: lognormal, median ``MEDIAN_S``, p99 10x the median."""
    g = torch.Generator().manual_seed(seed)
    return MEDIAN_S * torch.exp(SIGMA * torch.randn(n, generator=g, dtype=torch.float64))


def batch_costs(costs: torch.Tensor) -> torch.Tensor:
    return costs[: len(costs) // BATCH * BATCH].view(-1, BATCH).sum(1)


class SlowReads(torch.utils.data.Dataset):
    """Sample ``i`` is its index, read in ``cost[i]`` seconds (x ``slowdown``)."""

    def __init__(self, costs: torch.Tensor, slowdown: float = 1.0):
        self.costs = costs.tolist()
        self.slowdown = slowdown

    def __len__(self):
        return len(self.costs)

    def __getitem__(self, i):
        time.sleep(self.costs[i] * self.slowdown)
        # 256 KiB a sample, the size of a small image: above FlowPolicy.small_batch_bytes, so
        # the input side runs at its ordinary look-ahead (as with real data)
        return torch.full((SAMPLE_FLOATS,), float(i))


def input_fn(slow_worker=None, seed=SEED):
    info = cstorch.distributed.get_worker_info()
    slowdown = 2.0 if info.local_worker_id == slow_worker and info.num_workers_per_csx > 1 \
        else 1.0
    dataset = SlowReads(read_costs(seed=seed), slowdown)
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), BATCH,
                                            drop_last=True)
    return torch.utils.data.DataLoader(dataset, batch_sampler=
                                       cstorch.utils.data.ShardedSampler(batches))


def run(mode: str, steps: int, wafer_step_s: float, slow_worker=None, seed=SEED,
        **config) -> dict:
    cfg = cstorch.utils.CSConfig(num_workers_per_csx=WORKERS, input_assignment=mode,
                                 wafer_seconds_per_step=wafer_step_s, **config)
    loader = cstorch.utils.data.DataLoader(input_fn, slow_worker=slow_worker, seed=seed)
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=steps, cs_config=cfg)
    for _ in executor:
        pass
    report = executor.report
    # the steady state: after the first 10% of the steps (the workers' start-up, and the
    # look-ahead filling from empty at the wafer's pace)
    recs = executor.step_records[steps // 10:]
    wall = recs[-1]["wafer_t"] - executor.step_records[steps // 10 - 1]["wafer_t"]
    compute = sum(r["compute_s"] for r in recs)
    a = report["input_assignment"]
    # each worker's rate: 1 / its mean batch cost, measured in the worker (what it can deliver)
    worker_rates = [1 / w["batch_cost_mean_s"] for w in a["workers"]]
    return {
        "mode": a["mode"],
        "utilisation": compute / wall,
        "batches_per_s": len(recs) / wall,
        "sum_of_worker_rates": sum(worker_rates),
        "worker_rates": worker_rates,
        "report_utilisation": report["utilisation"],
        "straggler_wait_s": a["straggler_wait_s"],
        "stragglers_cost_utilisation": a["stragglers_cost_utilisation"],
        "straggler_worker": a["straggler_worker"],
        "reorder_window": a["reorder_window"],
        "batch_cost_p50_ms": [1000 * w["batch_cost_p50_s"] for w in a["workers"]],
        "batch_cost_p99_ms": [1000 * w["batch_cost_p99_s"] for w in a["workers"]],
        "batches_per_worker": [w["batches"] for w in a["workers"]],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "stragglers.json"))
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return

    def cases_for(seed):
        costs = batch_costs(read_costs(seed=seed))[: args.steps]  # the batches a run streams
        mean_batch_s = float(costs.mean())
        capacity = WORKERS / mean_batch_s  # global batches/s of 4 workers at their mean cost
        ideal_slow = (WORKERS - 1) / mean_batch_s + 1 / (2 * mean_batch_s)
        return {
            "heavy_tail": {"wafer_step_s": 1 / (0.85 * capacity), "slow_worker": None,
                           "config": {}},
            "heavy_tail_tight_memory": {
                "wafer_step_s": 1 / (0.85 * capacity), "slow_worker": None,
                "config": {"input_bytes_in_flight_per_csx": TIGHT_BATCHES * SAMPLE_FLOATS * 4}},
            "one_slow_worker": {"wafer_step_s": 1 / (1.25 * ideal_slow),
                                "slow_worker": SLOW_WORKER, "config": {}},
        }

    costs = batch_costs(read_costs())
    cases = cases_for(SEED)
    mean_batch_s = float(costs.mean())
    capacity = WORKERS / mean_batch_s
    results = {
        "setup": {
            "workers": WORKERS, "samples_per_batch": BATCH, "steps": args.steps,
            "rounds": args.rounds, "seeds": [SEED + r for r in range(args.rounds)],
            "sample_cost_median_ms": 1000 * MEDIAN_S,
            "sample_cost_p99_over_median": round(math.exp(2.3263 * SIGMA), 2),
            "batch_cost_mean_ms": 1000 * mean_batch_s,
            "batch_cost_p50_ms": 1000 * float(costs.median()),
            "batch_cost_p99_ms": 1000 * float(costs.quantile(0.99)),
            "workers_capacity_batches_per_s": capacity,
            "cpu_count": os.cpu_count(),
        },
        "cases": {},
    }
    backend = cstorch.backend("CSX", artifact_dir=tempfile.mkdtemp(prefix="cstream-bench-"))
    runs = {case: {"static": [], "dynamic": []} for case in cases}
    for r in range(args.rounds):
        seed = SEED + r  # each round its own cost table; both modes of a round the same one
        for case, spec in cases_for(seed).items():
            order = ("static", "dynamic") if r % 2 == 0 else ("dynamic", "static")
            for mode in order:
                row = run(mode, args.steps, spec["wafer_step_s"], spec["slow_worker"], seed,
                          **spec["config"])
                row["seed"], row["wafer_seconds_per_step"] = seed, spec["wafer_step_s"]
                runs[case][mode].append(row)
                print(f"round {r + 1} {case:26s} {mode:8s} utilisation "
                      f"{100 * row['utilisation']:5.1f}%  {row['batches_per_s']:6.1f} batches/s "
                      f"(sum of worker rates {row['sum_of_worker_rates']:.1f})  straggler wait "
                      f"{row['straggler_wait_s']:.2f} s", flush=True)
    backend.shutdown()
    for case, spec in cases.items():
        entry = {"config": spec["config"], "slow_worker": spec["slow_worker"]}
        for mode in ("static", "dynamic"):
            rows = runs[case][mode]
            entry[mode] = {
                "utilisation": statistics.median(x["utilisation"] for x in rows),
                "batches_per_s": statistics.median(x["batches_per_s"] for x in rows),
                "fraction_of_worker_rates": statistics.median(
                    x["batches_per_s"] / x["sum_of_worker_rates"] for x in rows),
                "runs": rows,
            }
        results["cases"][case] = entry
    for case in ("heavy_tail", "heavy_tail_tight_memory"):
        e = results["cases"][case]
        print(f"{case}: utilisation static {100 * e['static']['utilisation']:.1f}%, dynamic "
              f"{100 * e['dynamic']['utilisation']:.1f}%")
    sw = results["cases"]["one_slow_worker"]
    print(f"one 2x slow worker: static {100 * sw['static']['fraction_of_worker_rates']:.1f}% of "
          f"the sum of the workers' rates (cap 4 x slowest = {100 * 4 * 0.5 / 3.5:.1f}%), "
          f"dynamic {100 * sw['dynamic']['fraction_of_worker_rates']:.1f}%")
    save_results(results, out, plot)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    colors = {"static": "tab:gray", "dynamic": "tab:blue"}
    panels = (
        ("heavy_tail", "utilisation", "heavy tail, default look-ahead", "wafer utilisation (%)"),
        ("heavy_tail_tight_memory", "utilisation",
         f"heavy tail, {TIGHT_BATCHES} batches in flight per CS-X", "wafer utilisation (%)"),
        ("one_slow_worker", "fraction_of_worker_rates", "one worker 2x slower",
         "batches/s, % of the sum of worker rates"))
    for ax, (case, key, title, ylabel) in zip(axes, panels):
        entry = cases[case]
        for i, mode in enumerate(("static", "dynamic")):
            runs = [100 * (r["utilisation"] if key == "utilisation" else
                           r["batches_per_s"] / r["sum_of_worker_rates"])
                    for r in entry[mode]["runs"]]
            med = 100 * entry[mode][key]
            ax.bar(i, med, color=colors[mode], alpha=0.8, label=f"{mode}: {med:.1f}%")
            ax.plot([i] * len(runs), runs, "k.", alpha=0.6)
        ax.set_xticks([0, 1], ["static", "dynamic"])
        ax.set_ylim(0, 105)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.axhline(95 if key == "utilisation" else 90, color="tab:green", ls="--", lw=1,
                   label="target")
    axes[2].axhline(100 * 4 * 0.5 / 3.5, color="tab:red", ls=":", lw=1,
                    label="4 x slowest worker")
    for ax in axes:
        ax.legend(fontsize=8, loc="lower right")
    s = results["setup"]
    fig.suptitle(f"{s['workers']} Ray input workers, {s['samples_per_batch']} sample a batch, "
                 f"lognormal read cost (median {s['sample_cost_median_ms']:.0f} ms, p99 "
                 f"{s['sample_cost_p99_over_median']:.0f}x), wafer at 85% of the workers' "
                 f"capacity (slow worker: input-bound); medians of {s['rounds']} rounds",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
