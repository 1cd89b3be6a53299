"""Batches of a known per-batch cost, for profiling an input pipeline against the simulated wafer.

``cost_ms`` of work per batch in each input worker: ``"sleep"`` (I/O-like: reading, decoding in
native code; workers overlap on any number of cores) or ``"cpu"`` (``cost_ms`` of CPU time in pure
Python arithmetic, so a worker that shares its core takes longer: one
core per worker). With W workers per CS-X a pipeline delivers at most ``W * 1000 / cost_ms``
batches/s, so against a wafer step of ``S`` seconds the wafer is fed once
``W >= cost_ms / (1000 * S)``.

>>> batches = synthetic_input_fn(batch_size=2, features=3, cost_ms=0, num_batches=2)
>>> [tuple(x.shape) for x, y in batches]
[(2, 3), (2, 3)]
"""

from __future__ import annotations

import time

import torch

from workers.checks import positive_int

COST_KINDS = ("sleep", "cpu")


def _burn(seconds: float) -> None:
    """``seconds`` of this thread's CPU time (not of wall time): like real CPU-bound work, it
    takes longer when the thread shares its core."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i * i


class SyntheticBatches:
    """An iterable of ``num_batches`` (inputs, labels) batches, each costing ``cost_ms``."""

    def __init__(self, batch_size: int, features: int, classes: int, cost_ms: float,
                 cost_kind: str, num_batches: int, seed: int):
        self.batch_size, self.features, self.classes = batch_size, features, classes
        self.cost_s = cost_ms / 1000.0
        self.cost_kind = cost_kind
        self.num_batches = num_batches
        self.seed = seed

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.num_batches):
            if self.cost_s > 0:
                if self.cost_kind == "sleep":
                    time.sleep(self.cost_s)
                else:
                    _burn(self.cost_s)
            x = torch.randn(self.batch_size, self.features, generator=g)
            y = torch.randint(0, self.classes, (self.batch_size,), generator=g)
            yield x, y


def synthetic_input_fn(batch_size: int = 32, features: int = 64, classes: int = 10,
                       cost_ms: float = 10.0, cost_kind: str = "sleep",
                       num_batches: int = 1000, seed: int = 0) -> SyntheticBatches:
    """Random (inputs, labels) batches; each costs ``cost_ms`` in the worker that makes it."""
    for name, value in (("batch_size", batch_size), ("features", features), ("classes", classes),
                        ("num_batches", num_batches)):
        positive_int(value, f"synthetic_input_fn: {name}")
    if isinstance(cost_ms, bool) or not isinstance(cost_ms, (int, float)) or cost_ms < 0:
        raise ValueError(f"synthetic_input_fn: cost_ms must be a number >= 0, got {cost_ms!r}.")
    if cost_kind not in COST_KINDS:
        raise ValueError(f"synthetic_input_fn: cost_kind must be one of {COST_KINDS}, got "
                         f"{cost_kind!r}.")
    from cstream.distributed import get_worker_info

    info = get_worker_info()
    worker_seed = seed * 1000 + (info.wse_id * info.num_workers_per_csx + info.local_worker_id
                                 if info is not None else 0)
    return SyntheticBatches(batch_size, features, classes, float(cost_ms), cost_kind, num_batches,
                            worker_seed)
