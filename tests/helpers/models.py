"""The small models the tests train and their batches. ``TinyLM`` is the library's
(``cstream_tools.models``), the one the benchmarks train too."""

import torch

from cstream_tools.models import TinyLM

__all__ = ["TinyLM", "lm_input_fn", "lm_batches", "mlp", "vectors", "mse", "next_token"]


def lm_input_fn(batch=4, seq=16, n=50):
    """``n`` batches of (tokens, the next tokens) of 64-token text, ``batch`` rows of ``seq``."""
    g = torch.Generator().manual_seed(5)
    text = torch.randint(0, 64, (n * batch * (seq + 1),), generator=g).view(n, batch, seq + 1)
    return [(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()) for chunk in text]


def lm_batches(n=4):
    return lm_input_fn(n=n)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def vectors(n=4):
    """``n`` batches of 4 (features of 8, a regression target)."""
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def mse(compiled, batch):
    x, y = batch
    return ((compiled(x) - y) ** 2).mean()


def next_token(compiled, batch):
    """Cross-entropy of ``TinyLM``'s default 64-token vocabulary against the next tokens."""
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(compiled(inputs).reshape(-1, 64), targets.reshape(-1))
