"""Soak: a long run keeps the client's and the driver's memory flat and the buffers bounded.

20,000 steps (``--steps``) of a tiny traced model fed by 8 Ray input workers, against a simulated
wafer; the resident memory of the client and of the driver actor is sampled every
``--sample-every`` steps. Growth is measured from the end of the warm-up (10% of the run).
Writes ``benchmarks/results/soak.json``.

    python -m benchmarks.soak [--steps 20000] [--workers 8]
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

ROOT = Path(__file__).resolve().parents[1]

import cstream as cstorch  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from executor.driver import rss_bytes  # noqa: E402


def soak_input_fn(batch: int = 16):
    """An endless stream of small batches with sample ids; each worker its own ids."""
    info = cstorch.distributed.get_worker_info()

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            i = info.global_worker_id
            while True:
                yield torch.randn(batch, 16), torch.full((batch,), i, dtype=torch.int64)
                i += info.total_num_workers

    return torch.utils.data.DataLoader(Stream(), batch_size=None)


def soak(steps: int, workers: int, sample_every: int, wafer_s: float, in_process: bool = False):
    backend = cstorch.backend("CSX", in_process=in_process,
                              artifact_dir=tempfile.mkdtemp(prefix="cstream-soak-"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.01)

    @cstorch.trace
    def step(batch):
        x, ids = batch
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss, ids

    samples = []
    last_ids = []

    @cstorch.step_closure
    def check(loss, ids):
        last_ids.append(int(ids[0]))

    cfg = cstorch.utils.CSConfig(num_workers_per_csx=workers, wafer_seconds_per_step=wafer_s)
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(soak_input_fn), num_steps=steps, cs_config=cfg)
    t0 = time.perf_counter()
    for i, batch in enumerate(executor):
        loss, ids = step(batch)
        if (i + 1) % sample_every == 0 or i == 0:
            check(loss, ids)  # a sync point: the client waits for the wafer here
            d = backend.driver().describe()
            samples.append({"step": i + 1, "t": time.perf_counter() - t0,
                            "client_rss": rss_bytes(), "driver_rss": d["rss_bytes"],
                            "outputs_kept": d["outputs_kept"]})
    wall = time.perf_counter() - t0
    backend.shutdown()
    warm = next(s for s in samples if s["step"] >= steps // 10)
    end = samples[-1]
    return {
        "steps": steps, "workers": workers, "wall_s": wall, "steps_per_s": steps / wall,
        "client_rss_growth": end["client_rss"] / warm["client_rss"] - 1,
        "driver_rss_growth": end["driver_rss"] / warm["driver_rss"] - 1,
        "max_outputs_kept": max(s["outputs_kept"] for s in samples),
        "samples": samples,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sample-every", type=int, default=1000)
    p.add_argument("--wafer-seconds-per-step", type=float, default=0.001)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak.json"))
    args = p.parse_args(argv)
    r = soak(args.steps, args.workers, args.sample_every, args.wafer_seconds_per_step)
    print(f"{r['steps']} steps, {r['workers']} workers: {r['wall_s']:.1f} s "
          f"({r['steps_per_s']:.0f} steps/s); RSS growth after warm-up: client "
          f"{r['client_rss_growth']:+.1%}, driver {r['driver_rss_growth']:+.1%}; outputs kept "
          f"at most {r['max_outputs_kept']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**r, "machine": describe()}, indent=1))


if __name__ == "__main__":
    main()
