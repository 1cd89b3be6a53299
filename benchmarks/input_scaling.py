"""Input-pipeline scaling: cstream's Ray input workers against torch's DataLoader, in one run.

For 1, 2, 4 and 8 workers and two kinds of input function:

* ``io``  -- every batch waits 20 ms (reading from a slow store);
* ``cpu`` -- every batch burns ~32 ms of CPU in 32 Python/numpy chunks of ~1 ms;

it measures batches/s reaching the simulated wafer (no model: the wafer only consumes) beside
``torch.utils.data.DataLoader(num_workers=N)`` on the same data set, and the wafer's input-wait
fraction. It also measures worker -> wafer transport of 4 MiB batches, and of 32 MiB batches
from 4 workers at the defaults with the object store's peak use and the bytes Ray spilled to
disk. Variants interleave and medians are reported. Writes
``benchmarks/results/input_scaling.json`` and ``input_scaling.png``.

``--quick`` measures only, at 1, 2, 4 and 8 workers and over 80 and 500 steps, a tiny model
(``Linear(256, 10)``) trained on the wafer from I/O-like batches of 32 x 256 floats, rated by
``executor.profiler.global_rate()`` after the loop, beside the same model fed in one process by
``DataLoader(num_workers=N, prefetch_factor=4)`` (``input_scaling_quick.json``).

    python -m benchmarks.input_scaling [--quick] [--only-32mib]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

import cstream as cstorch  # noqa: E402
from benchmarks.bench_data import BATCH, SlowBatches, save_results  # noqa: E402
from benchmarks.machine import describe  # noqa: E402


def slow_input_fn(kind: str, num_batches: int, nbytes: int = 0):
    """Each worker streams its share of the batch indices (global worker g takes g, g+T, ...)."""
    dataset = SlowBatches(kind, num_batches, nbytes)
    sampler = cstorch.utils.data.DistributedSampler(dataset, shuffle=False)
    return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=sampler)


def cstream_rate(kind: str, workers: int, steps: int, nbytes: int = 0, **config) -> dict:
    cfg = cstorch.utils.CSConfig(num_workers_per_csx=workers, **config)
    loader = cstorch.utils.data.DataLoader(slow_input_fn, kind, steps * 4, nbytes)
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=steps, cs_config=cfg)
    for _ in executor:
        pass
    recs = executor.step_records
    warm = max(steps // 10, 2)  # leave out the workers' start-up
    t = [r["wafer_t"] for r in recs]
    span = t[-1] - t[warm - 1]
    wait = sum(r["input_wait_s"] for r in recs[warm:])
    nb = sum(r.get("bytes", 0) for r in recs[warm:])
    return {"batches_per_s": (len(recs) - warm) / span, "input_wait_fraction": wait / span,
            "bytes_per_s": nb / span}


class ObjectStoreSampler(threading.Thread):
    """Samples the Ray object store's use (in memory plus fallback files) every ``every_s``;
    ``peak_bytes`` is the most seen, ``spilled_bytes`` what Ray spilled to disk meanwhile."""

    def __init__(self, every_s: float = 0.05):
        super().__init__(daemon=True)
        self.every_s = every_s
        self.peak_bytes = 0
        self._done = threading.Event()
        first = self._stats()
        self.capacity_bytes = first.object_store_bytes_avail
        self._spilled0 = first.spilled_bytes_total

    @staticmethod
    def _stats():
        import ray._private.state
        from ray._private import internal_api

        reply = internal_api.get_memory_info_reply(ray._private.state.state)
        return reply.store_stats

    def run(self):
        while not self._done.is_set():
            s = self._stats()
            self.peak_bytes = max(self.peak_bytes, s.object_store_bytes_used
                                  + s.object_store_bytes_fallback)
            self._done.wait(self.every_s)

    def finish(self) -> dict:
        self._done.set()
        self.join()
        spilled = self._stats().spilled_bytes_total - self._spilled0
        return {"peak_object_store_bytes": self.peak_bytes,
                "object_store_bytes": self.capacity_bytes, "spilled_bytes": spilled}


def transport_32mib(rounds: int, steps: int = 240) -> dict:
    """32 MiB batches from 4 workers into one CS-X at the defaults: MB/s reaching the wafer,
    the object store's peak use and the bytes spilled to disk (medians over ``rounds``)."""
    from executor.ray_session import ensure_ray

    ensure_ray()  # the sampler reads the store before the run's backend joins it
    runs = []
    for _ in range(rounds):
        sampler = ObjectStoreSampler()
        sampler.start()
        r = cstream_rate("none", 4, steps, nbytes=32 << 20)
        runs.append({"MBps": r["bytes_per_s"] / 1e6, **sampler.finish()})
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    row["max_spilled_bytes"] = max(r["spilled_bytes"] for r in runs)
    row["runs"] = runs
    print(f"32 MiB batches, 4 workers -> wafer, defaults: {row['MBps']:.0f} MB/s, object store "
          f"peak {row['peak_object_store_bytes'] / 2**20:.0f} MiB of "
          f"{row['object_store_bytes'] / 2**20:.0f} MiB, spilled {row['max_spilled_bytes']} bytes")
    return row


MODEL_FEATURES = 256  # the model comparison's batches: 32 x 256 floats


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Linear(MODEL_FEATURES, 10)


def model_input_fn(num_batches: int):
    """The I/O-like data set (20 ms a batch) at 32 x 256 floats, each worker taking its share."""
    dataset = SlowBatches("io", num_batches, features=MODEL_FEATURES)
    sampler = cstorch.utils.data.DistributedSampler(dataset, shuffle=False)
    return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=sampler)


def cstream_model_rate(workers: int, steps: int) -> tuple[float, float, float]:
    """Samples/s as ``executor.profiler.global_rate()`` reads it after ``steps`` training steps of
    a tiny model on the wafer, fed by ``workers`` Ray input workers; the same figure with the
    run's shutdown counted (the clock read after the loop: what ``global_rate()`` returned
    while its clock ran on after the last step); the shutdown's seconds."""
    model = tiny_model()
    backend = cstorch.current_backend()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=1e-3)

    @cstorch.compile_step
    def training_step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(compiled(x), y % 10)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    loader = cstorch.utils.data.DataLoader(model_input_fn, steps * 2)
    executor = cstorch.utils.data.DataExecutor(
        loader, num_steps=steps, cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
    for batch in executor:
        training_step(batch)
    now = time.perf_counter()
    p = executor.profiler
    with_shutdown = (p.samples - executor.step_records[0]["samples"]) / (now - p.first_step_end)
    return p.global_rate(), with_shutdown, now - p.last_step_end


def torch_model_rate(workers: int, steps: int) -> float:
    """The same model and data in one process, fed by ``DataLoader(num_workers=workers,
    prefetch_factor=4)``, rated as ``global_rate`` is: the samples after the first step over the
    seconds since the first step ended."""
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(SlowBatches("io", steps * 2, features=MODEL_FEATURES),
                                         batch_size=None, num_workers=workers, prefetch_factor=4)
    it = iter(loader)
    t0 = None
    for step in range(steps):
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y % 10)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            t0 = time.perf_counter()
    rate = (steps - 1) * BATCH / (time.perf_counter() - t0)
    del it
    return rate


def model_comparison(grid, steps_list, rounds: int) -> dict:
    """cstream's ``global_rate`` over torch's in-process DataLoader, training a tiny model on
    I/O-like batches, for each worker count and run length; variants interleave, medians."""
    samples = {(n, s): {"cstream": [], "cstream_with_shutdown": [], "shutdown_s": [], "torch": []}
               for n in grid for s in steps_list}
    for _ in range(rounds):
        for n in grid:
            for s in steps_list:
                row = samples[n, s]
                cs, with_shutdown, shutdown_s = cstream_model_rate(n, s)
                row["cstream"].append(cs)
                row["cstream_with_shutdown"].append(with_shutdown)
                row["shutdown_s"].append(shutdown_s)
                row["torch"].append(torch_model_rate(n, s))
    table = {}
    for (n, s), row in samples.items():
        med = {k: statistics.median(v) for k, v in row.items()}
        cs, tt = med["cstream"], med["torch"]
        table[f"{n}_workers_{s}_steps"] = {
            "workers": n, "steps": s, "cstream_samples_per_s": cs, "torch_samples_per_s": tt,
            "cstream_vs_torch": cs / tt,
            "cstream_with_shutdown_vs_torch": med["cstream_with_shutdown"] / tt,
            "shutdown_s": med["shutdown_s"], "samples": row}
        print(f"tiny model, io, workers={n}, steps={s}: cstream global_rate {cs:7.1f} samples/s, "
              f"torch DataLoader {tt:7.1f}, ratio {cs / tt:.3f}; shutdown counted: ratio "
              f"{med['cstream_with_shutdown'] / tt:.3f} (shutdown {med['shutdown_s']:.2f} s)")
    return table


def torch_rate(kind: str, workers: int, steps: int) -> float:
    dataset = SlowBatches(kind, steps * 4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers,
                                         prefetch_factor=4, persistent_workers=False)
    it = iter(loader)
    warm = max(steps // 10, 2)
    for _ in range(warm):
        next(it)
    t0 = time.perf_counter()
    for _ in range(steps - warm):
        next(it)
    rate = (steps - warm) / (time.perf_counter() - t0)
    del it
    return rate


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "input_scaling.json"))
    p.add_argument("--plot-only", action="store_true",
                   help="redraw the PNG from the JSON results at --out; measure nothing")
    p.add_argument("--only-32mib", action="store_true",
                   help="measure only the 32 MiB x 4 workers row and update it in --out")
    p.add_argument("--object-store-mib", type=int, default=None,
                   help="with --only-32mib: start Ray with an object store of this size "
                        "instead of the default (30%% of the machine's memory)")
    args = p.parse_args(argv)
    if args.only_32mib:
        out = Path(args.out)
        results = json.loads(out.read_text()) if out.exists() else {}
        key = "transport_32MiB_4_workers"
        if args.object_store_mib:
            import ray

            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=args.object_store_mib << 20,
                     runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
            key += f"_store_{args.object_store_mib}MiB"
        backend = cstorch.backend("CSX", artifact_dir=tempfile.mkdtemp(prefix="cstream-bench-"))
        results[key] = transport_32mib(args.rounds)
        results[key]["cpu_count"] = os.cpu_count()
        results["machine"] = describe()
        backend.shutdown()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=float))
        print(f"wrote {out}")
        return
    if args.plot_only:
        out = Path(args.out)
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.png')}")
        return
    if args.quick:
        backend = cstorch.backend("CSX", artifact_dir=tempfile.mkdtemp(prefix="cstream-bench-"))
        results = {"cpu_count": os.cpu_count(), "machine": describe(), "rounds": args.rounds,
                   "model_comparison": model_comparison([1, 2, 4, 8], [80, 500], args.rounds)}
        backend.shutdown()
        out = Path(args.out).with_name("input_scaling_quick.json")
        out.write_text(json.dumps(results, indent=1, default=float))
        print(f"wrote {out}")
        return
    rounds = args.rounds
    grid = [1, 2, 4, 8]
    backend = cstorch.backend("CSX", artifact_dir=tempfile.mkdtemp(prefix="cstream-bench-"))
    results = {"cpu_count": os.cpu_count(), "rounds": rounds, "batch": BATCH, "kinds": {}}
    # enough steps that every worker delivers ~120 (I/O) or ~60 (CPU) batches: with few per
    # worker, start-up and the batches queued when timing starts skew both sides' rates
    steps = {"io": lambda n: 120 * n, "cpu": lambda n: 60 * min(n, 4)}
    for kind in ("io", "cpu"):
        samples = {n: {"cstream": [], "torch": [], "wait": []} for n in grid}
        for _ in range(rounds):
            for n in grid:
                r = cstream_rate(kind, n, steps[kind](n))
                samples[n]["cstream"].append(r["batches_per_s"])
                samples[n]["wait"].append(r["input_wait_fraction"])
                samples[n]["torch"].append(torch_rate(kind, n, steps[kind](n)))
        table = {}
        base = statistics.median(samples[grid[0]]["cstream"])
        for n in grid:
            cs = statistics.median(samples[n]["cstream"])
            tt = statistics.median(samples[n]["torch"])
            table[n] = {"cstream_batches_per_s": cs, "torch_batches_per_s": tt,
                        "cstream_vs_torch": cs / tt, "speedup_vs_1_worker": cs / base,
                        "scaling_efficiency": cs / (base * n),
                        "wafer_input_wait_fraction": statistics.median(samples[n]["wait"]),
                        "samples": samples[n]}
            print(f"{kind:3s} workers={n}: cstream {cs:7.1f} batches/s (x{cs / base:.2f}, "
                  f"efficiency {cs / (base * n):.2f}), torch DataLoader {tt:7.1f} batches/s, "
                  f"ratio {cs / tt:.2f}, wafer waits {table[n]['wafer_input_wait_fraction']:.0%}")
        results["kinds"][kind] = table
    # transport: 4 MiB batches, no per-batch cost; the default (several ready batches per
    # reply) beside one batch per reply
    default = cstorch.utils.CSConfig().batches_per_fetch
    trans = {default: [], 1: []}
    for _ in range(rounds):
        for per_fetch in trans:
            trans[per_fetch].append(cstream_rate("none", 2, 300, nbytes=4 << 20,
                                                 batches_per_fetch=per_fetch)["bytes_per_s"])
    results["transport_4MiB_GBps"] = statistics.median(trans[default]) / 1e9
    results["transport_4MiB_GBps_one_batch_per_fetch"] = statistics.median(trans[1]) / 1e9
    results["batches_per_fetch"] = default
    results["transport_32MiB_4_workers"] = transport_32mib(rounds)
    print(f"transport of 4 MiB batches, 2 workers -> wafer: {results['transport_4MiB_GBps']:.2f} "
          f"GB/s (batches_per_fetch={default}); "
          f"{results['transport_4MiB_GBps_one_batch_per_fetch']:.2f} GB/s with 1")
    backend.shutdown()
    save_results(results, args.out, plot)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (kind, table) in zip(axes, results["kinds"].items()):
        table = {int(n): row for n, row in table.items()}  # JSON keys are strings
        ns = sorted(table)
        ax.plot(ns, [table[n]["cstream_batches_per_s"] for n in ns], "o-", label="cstream (Ray)")
        ax.plot(ns, [table[n]["torch_batches_per_s"] for n in ns], "s--",
                label="torch DataLoader")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("input workers")
        ax.set_ylabel("batches/s")
        ax.set_title({"io": "I/O-like: 20 ms per batch", "cpu": "CPU-bound: ~32 ms per batch"}
                     [kind])
        ax.grid(alpha=0.3)
        ax2 = ax.twinx()
        ax2.bar(ns, [table[n]["wafer_input_wait_fraction"] for n in ns], alpha=0.15,
                width=[n * 0.3 for n in ns], color="gray", label="wafer input-wait fraction")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("wafer input-wait fraction")
        ax.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    np.random.seed(0)
    main()
