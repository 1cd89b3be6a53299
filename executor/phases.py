"""Start-up phases of a run (starting Ray, starting input workers, tracing, compiling, the first
step), announced as they begin and end.

The code that does the work wraps it in :func:`phase`; a progress display subscribes with
:func:`listen` and shows each phase with its elapsed time, and the run's profile and timeline
keep the finished phases (:func:`take`).

>>> seen = []
>>> stop = listen(lambda event, name, elapsed_s: seen.append((event, name)))
>>> with phase("tracing"):
...     pass
>>> stop()
>>> seen
[('start', 'tracing'), ('end', 'tracing')]
>>> [p["name"] for p in take()]
['tracing']
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

Listener = Callable[[str, str, float], None]
"""``listener(event, name, elapsed_s)``: event is ``"start"`` (elapsed 0) or ``"end"``."""

_lock = threading.Lock()
_listeners: list[Listener] = []
_finished: list[dict] = []
_MAX_KEPT = 100  # phases nobody took (backends used without an executor) do not pile up


def listen(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` at every phase's start and end; returns the function that stops it."""
    with _lock:
        _listeners.append(listener)

    def stop():
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return stop


def _notify(event: str, name: str, elapsed_s: float) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event, name, elapsed_s)


@contextlib.contextmanager
def phase(name: str):
    """Announce the phase ``name`` while the block runs; record its wall-clock span."""
    t0, t0_unix = time.perf_counter(), time.time()
    _notify("start", name, 0.0)
    try:
        yield
    finally:
        elapsed = time.perf_counter() - t0
        with _lock:
            _finished.append({"name": name, "start_unix": t0_unix, "end_unix": time.time(),
                              "elapsed_s": elapsed})
            del _finished[:-_MAX_KEPT]
        _notify("end", name, elapsed)


def take() -> list[dict]:
    """The phases finished since the last call (oldest first), forgotten here."""
    with _lock:
        out = list(_finished)
        _finished.clear()
    return out
