"""Profile an input pipeline against a simulated wafer: how many input workers keep it busy?

    python examples/profile_input_pipeline.py                        # 1, 2, 4 and 8 workers
    python examples/profile_input_pipeline.py --workers 1,2,3 --decode-ms 30
    python examples/profile_input_pipeline.py --wafer-samples-per-sec 8000 --out my_sweep

The pipeline is the digits data of examples/data.py with a simulated decode cost per batch (as
if every image were read and decoded from disk). No model is trained: the wafer only consumes
batches, each step held for batch_size / --wafer-samples-per-sec seconds, so the run measures the
input side alone. For each worker count the script prints the wafer's utilisation, the time it
starved for input and the input-buffer fill, then plots samples/s and utilisation against the
worker count (the same table and plot as `cstream sweep`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from data import digits
from torch.utils.data import BatchSampler, RandomSampler

import cstream as cstorch
from cstream_tools.sweep import best_counts, plot_sweep, sweep_table


def decoded_digits_input_fn(batch_size: int = 64, decode_ms: float = 20.0, seed: int = 0):
    """Shuffled digits batches; every batch costs its worker ``decode_ms`` (I/O-like: sleeps)."""
    dataset = digits("train")
    order = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    batches = BatchSampler(order, batch_size=batch_size, drop_last=True)

    def collate(samples):
        time.sleep(decode_ms / 1000)  # the simulated read + decode of one batch
        return torch.utils.data.default_collate(samples)

    return torch.utils.data.DataLoader(
        dataset, batch_sampler=cstorch.utils.data.ShardedSampler(batches), collate_fn=collate)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2,4,8", help="worker counts per CS-X to try")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--decode-ms", type=float, default=20.0, help="cost of one batch in a worker")
    p.add_argument("--wafer-samples-per-sec", type=float, default=6400.0,
                   help="the simulated wafer's speed (6,400 samples/s: a 64-sample step per 10 ms)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default="profile_input_pipeline", help="folder for the plot")
    args = p.parse_args(argv)
    workers = sorted(int(w) for w in args.workers.split(","))
    step_s = args.batch_size / args.wafer_samples_per_sec
    theory = -(-args.decode_ms // (1000 * step_s))
    print(f"wafer step {1000 * step_s:.1f} ms, decode {args.decode_ms:g} ms per batch: theory "
          f"says {theory:.0f} workers per CS-X keep the wafer fed")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # one backend serves every run: its wafer driver and Ray start once
    backend = cstorch.backend("CSX", artifact_dir=str(out / "runs"))
    rows = []
    try:
        for w in workers:
            executor = cstorch.utils.data.DataExecutor(
                cstorch.utils.data.DataLoader(decoded_digits_input_fn, batch_size=args.batch_size,
                                              decode_ms=args.decode_ms),
                num_steps=args.steps,
                cs_config=cstorch.utils.CSConfig(
                    num_workers_per_csx=w, wafer_samples_per_sec=args.wafer_samples_per_sec),
            )
            for _ in executor:  # model: none; the wafer consumes each batch in step_s seconds
                pass
            r = executor.report
            print(f"{w} workers: {r['samples_per_s']:8.1f} samples/s, utilisation "
                  f"{r['utilisation']:.1%}, input-starved {r['starved_fraction']:.1%}, buffer "
                  f"{r['mean_buffer_occupancy']:.1f} batches")
            rows.append({"num_csx": 1, "num_workers_per_csx": w, **r})
    finally:
        backend.shutdown()

    print(sweep_table(rows, 0.95))
    png = plot_sweep(rows, 0.95, out / "sweep.png",
                     f"digits + {args.decode_ms:g} ms decode vs wafer at "
                     f"{args.wafer_samples_per_sec:g} samples/s")
    print(f"plot: {png}")
    return best_counts(rows, 0.95)[1]


if __name__ == "__main__":
    main()
