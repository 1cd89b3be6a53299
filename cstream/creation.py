"""Creation ops for state tensors (lazy on the CSX backend): zeros, ones, full and *_like."""

from __future__ import annotations

import torch

from executor import runtime


def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        return tuple(size[0])
    return tuple(size)


def full(size, fill_value, dtype=None):
    """Like ``torch.full``; on CSX the tensor is created lazily, with the engine."""
    backend = runtime.current_backend()
    if backend is None:
        return torch.full(tuple(size), fill_value, dtype=dtype)
    return backend.full(tuple(size), fill_value, dtype=dtype)


def zeros(*size, dtype=None):
    return full(_size(size), 0, dtype=dtype or torch.get_default_dtype())


def ones(*size, dtype=None):
    return full(_size(size), 1, dtype=dtype or torch.get_default_dtype())


def full_like(other: torch.Tensor, fill_value, dtype=None):
    backend = runtime.current_backend()
    if backend is None:
        return torch.full_like(other, fill_value, dtype=dtype)
    return backend.full_like(other, fill_value, dtype=dtype)


def zeros_like(other: torch.Tensor, dtype=None):
    return full_like(other, 0, dtype=dtype)


def ones_like(other: torch.Tensor, dtype=None):
    return full_like(other, 1, dtype=dtype)


def state_tensor(tensor: torch.Tensor, readable: bool = False) -> torch.Tensor:
    """Make ``tensor`` a state tensor of the current backend (persisting across steps).

    Eager backends return it unchanged; on CSX it becomes a lazy handle whose value lives with
    the engine. Metrics and optimizers use this for state built from an existing tensor.
    ``readable`` state can be read inside a ``@step_closure`` during a run (its value after
    that closure's step): every step exports a copy of it, so keep it small (metric state).
    """
    backend = runtime.current_backend()
    if backend is None:
        return tensor
    return backend.state_tensor(tensor, readable=readable)
