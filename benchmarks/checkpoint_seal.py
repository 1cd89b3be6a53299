"""What sealing a checkpoint costs: ``cstream.save`` / ``cstream.load`` of a 100 MB state, with the
seal (the user block's length and CRC-32, written after HDF5 closes the file and checked before it
opens it) and without (the same writer, temporary file, fsync and rename, no user block), in
alternating rounds; prints the medians.

    python -m benchmarks.checkpoint_seal [--rounds 9] [--mb 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import cstream
from cstream.checkpoint import h5
from cstream.checkpoint.saving import _fsync, to_eager


def save_unsealed(obj, path: Path) -> None:
    """cstream.save's steps without the seal: the baseline."""
    tmp = path.parent / f".{path.name}.tmp"
    h5.write(obj, tmp, writer="cstream benchmark")
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    n = args.mb * 10**6 // 4 // 25
    state = {"model": {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(25)}, "step": 1}
    folder = Path(tempfile.mkdtemp())
    sealed, unsealed = folder / "sealed.h5", folder / "unsealed.h5"
    cstream.save(state, sealed)  # warm up: page cache, allocator
    save_unsealed(state, unsealed)
    times: dict[str, list[float]] = {k: [] for k in ("save sealed", "save unsealed", "open sealed",
                                                     "open unsealed", "load sealed", "load unsealed")}
    for _ in range(args.rounds):  # A B A B: the machine's noise falls on both
        times["save sealed"].append(timed(cstream.save, state, sealed))
        times["save unsealed"].append(timed(save_unsealed, state, unsealed))
        times["open sealed"].append(timed(cstream.load, sealed))
        times["open unsealed"].append(timed(cstream.load, unsealed))
        times["load sealed"].append(timed(lambda p: to_eager(cstream.load(p)), sealed))
        times["load unsealed"].append(timed(lambda p: to_eager(cstream.load(p)), unsealed))
    size = sealed.stat().st_size
    print(f"{size / 1e6:.1f} MB file, {args.rounds} alternating rounds, medians:")
    for name, values in times.items():
        print(f"  {name:14s} {statistics.median(values) * 1e3:8.1f} ms  "
              f"(min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f})")
    for what in ("save", "open", "load"):
        a = statistics.median(times[f"{what} sealed"])
        b = statistics.median(times[f"{what} unsealed"])
        print(f"  {what}: sealed {a / b:.2f}x the unsealed time ({(a - b) * 1e3:+.1f} ms)")


if __name__ == "__main__":
    main()
