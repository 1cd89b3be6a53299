"""The current backend and the executor being iterated: what the public API finds without
being handed it (``cstream.current_backend()``, ``cstream.current_executor()``, the closures
a step queues). Tests reset both with :func:`reset`.
"""

from __future__ import annotations

_current_backend = None
_current_executor = None


def current_backend(required: bool = False):
    if required and _current_backend is None:
        raise RuntimeError(
            "no cstream backend exists yet. Create one first, e.g. "
            'backend = cstream.backend("CPU") or cstream.backend("CSX"), or pass '
            'backend="CPU" to cstream.compile.'
        )
    return _current_backend


def set_backend(backend) -> None:
    global _current_backend
    if backend is not None and _current_backend is not None and _current_backend is not backend:
        raise RuntimeError(
            f"a {_current_backend.name} backend already exists; cstream runs one backend at a "
            "time. Use the existing one (cstream.current_backend()), or call "
            ".shutdown() on it before creating another."
        )
    _current_backend = backend


def clear_backend(backend) -> None:
    global _current_backend
    if _current_backend is backend:
        _current_backend = None


def current_executor():
    return _current_executor


def set_executor(executor) -> None:
    global _current_executor
    _current_executor = executor


def reset() -> None:
    """Shut down the current backend (if any) and forget the current executor."""
    global _current_executor
    backend = _current_backend
    if backend is not None:
        backend.shutdown()
    clear_backend(backend)
    _current_executor = None
