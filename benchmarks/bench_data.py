"""Data sets with a known per-batch cost, shared by the benchmarks (importable by workers)."""

from __future__ import annotations

import time

import torch

BATCH = 32


def burn_ms(ms: float) -> None:
    """Spend about ``ms`` milliseconds of CPU in pure Python (one core, no BLAS threads)."""
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x += i * i


class SlowBatches(torch.utils.data.Dataset):
    """Item i is a whole batch (features, labels, id) that costs a known time to produce."""

    def __init__(self, kind: str, num_batches: int, nbytes: int = 0):
        self.kind = kind
        self.num_batches = num_batches
        self.nbytes = nbytes
        self._payload = None

    def __len__(self):
        return self.num_batches

    def __getitem__(self, i):
        if self.kind == "io":
            time.sleep(0.020)
        elif self.kind == "cpu":
            for _ in range(32):
                burn_ms(1.0)
        if self.nbytes:
            if self._payload is None:
                self._payload = torch.randn(self.nbytes // 4 // 1024, 1024)
            return self._payload, torch.full((1,), i, dtype=torch.int64)  # transport only
        return torch.randn(BATCH, 64), torch.full((BATCH,), i, dtype=torch.int64)
