"""``cstream.compile(model, backend)``: prepare a module for a backend."""

from __future__ import annotations

import torch

from executor import runtime


def compile(model: torch.nn.Module, backend="CSX"):  # noqa: A001 - the API's name
    """Prepare ``model`` for ``backend`` (an object from :func:`cstream.backend`, or its type name).

    Like ``torch.compile`` this compiles nothing yet: it moves the parameters to the backend's
    device. The graph is traced and compiled on the first step, when the batch is known. After
    ``compile`` the parameters are frozen: finish initialising weights before calling it.

    >>> import torch, cstream
    >>> b = cstream.backend("CPU")
    >>> compiled = cstream.compile(torch.nn.Linear(2, 1), b)
    >>> compiled(torch.ones(3, 2)).shape
    torch.Size([3, 1])
    >>> b.shutdown()
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"cstream.compile expects a torch.nn.Module, got {type(model).__name__}.")
    if isinstance(backend, str):
        from cstream.backend import backend as make_backend

        current = runtime.current_backend()
        if current is not None and current.name == backend.upper():
            backend = current
        else:
            backend = make_backend(backend)
    current = runtime.current_backend()
    if current is not backend:
        raise RuntimeError(
            "cstream.compile was given a backend that is not the current one (it was shut "
            "down); create the backend again with cstream.backend(...)."
        )
    return backend.compile(model)
