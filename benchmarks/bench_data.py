"""Data sets with a known per-batch cost, shared by the benchmarks (importable by workers), and
the benchmarks' way of writing their results."""

from __future__ import annotations

import json
import time
from pathlib import Path

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

    def __init__(self, kind: str, num_batches: int, nbytes: int = 0, features: int = 64):
        self.kind = kind
        self.num_batches = num_batches
        self.nbytes = nbytes
        self.features = features
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
        return torch.randn(BATCH, self.features), torch.full((BATCH,), i, dtype=torch.int64)


# -- train_throughput.py: data in memory, the same input_fn for eager PyTorch and cstream ----------
#: the models of the headline benchmark: layer sizes or "lm", batch size, samples held in memory
TRAIN_MODELS = {
    "mlp_784_512_512_10_b64": {"sizes": [784, 512, 512, 10], "batch": 64, "samples": 2048},
    "mlp_16_64_64_4_b16": {"sizes": [16, 64, 64, 4], "batch": 16, "samples": 1024},
    "transformer_lm_2x128_seq64_b8": {"sizes": None, "batch": 8, "samples": 256},
}
LM_VOCAB, LM_SEQ = 256, 64
#: the benchmarks' small transformer LM (``cstream_tools.models.TinyLM``): 2 blocks of d128
LM = {"vocab": LM_VOCAB, "d": 128, "heads": 4, "layers": 2, "seq": LM_SEQ}


def mlp(sizes):
    """Linear layers of ``sizes`` with a ReLU between each two."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def memory_input_fn(model: str, seed: int = 0, sharded: bool = True):
    """Shuffled global batches of an in-memory ``TensorDataset``, as a user writes it: a torch
    DataLoader whose batch sampler is a ``ShardedSampler``, so each input worker streams its share
    of every global batch. ``sharded=False`` (eager PyTorch, no cstream imported) yields the same
    global batches with torch's own batch sampler."""
    spec = TRAIN_MODELS[model]
    g = torch.Generator().manual_seed(seed)
    n = spec["samples"]
    if spec["sizes"] is None:
        tokens = torch.randint(0, LM_VOCAB, (n, LM_SEQ + 1), generator=g)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    else:
        x = torch.randn(n, spec["sizes"][0], generator=g)
        y = torch.randint(0, spec["sizes"][-1], (n,), generator=g)
    dataset = torch.utils.data.TensorDataset(x, y)
    order = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    batches = torch.utils.data.BatchSampler(order, batch_size=spec["batch"], drop_last=True)
    if sharded:
        import cstream as cstorch

        batches = cstorch.utils.data.ShardedSampler(batches)
    return torch.utils.data.DataLoader(dataset, batch_sampler=batches)


class ReadyBatches(torch.utils.data.Dataset):
    """Item ``i`` is a ready 16x16 float batch (one of 64 made up front): nothing to compute, so
    a run over it measures what consuming a batch costs."""

    def __init__(self, num_batches: int):
        self.num_batches = num_batches
        g = torch.Generator().manual_seed(0)
        self.batches = [torch.randn(16, 16, generator=g) for _ in range(64)]

    def __len__(self):
        return self.num_batches

    def __getitem__(self, i):
        return self.batches[i % len(self.batches)]


def ready_batches_input_fn(num_batches: int):
    """:class:`ReadyBatches`, each input worker its own interleaved share."""
    import cstream as cstorch

    dataset = ReadyBatches(num_batches)
    sampler = cstorch.utils.data.DistributedSampler(dataset, shuffle=False)
    return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=sampler)


def save_results(results: dict, out, plot) -> None:
    """Write ``results`` to ``out`` (JSON), with the machine they were measured on where they
    do not say already, and ``plot(results, path)`` next to it (PNG)."""
    from benchmarks.machine import describe

    results.setdefault("machine", describe())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
