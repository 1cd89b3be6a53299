"""Warm up the tracing machinery in the background.

The first ``make_fx`` trace in a process costs ~1 s more than later ones (lazy imports and
first-use set-up inside torch). :func:`start` runs a tiny trace in a background thread -- with a
fake-tensor mode and a backward pass, as a captured step has -- while the user builds the model
and Ray starts; :func:`wait` (called before the first real capture) joins it, so two traces
never run at once.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch

from workers import torch_compat

_thread: Optional[threading.Thread] = None


def trace_once():
    """A two-op step with a backward pass, traced as :mod:`executor.engine.capture` traces a
    step (fake placeholders, their mode active); returns the graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, w):
        w = w.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(x @ w, torch.zeros(2, dtype=torch.long))
        loss.backward()
        return loss, w.grad

    mode = torch_compat.FakeTensorMode()
    x, w = mode.from_tensor(torch.zeros(2, 3)), mode.from_tensor(torch.zeros(3, 4))
    with mode:  # the step's own tensors (the target) are fake too
        return make_fx(step, tracing_mode="real")(x, w)


def _trace_in_background() -> None:
    try:
        trace_once()
    except Exception:  # only a warm-up: the real capture reports its own errors
        pass


def start() -> None:
    global _thread
    if _thread is None:
        torch_compat.install_fake_cuda_guard_here()  # before the thread enters a fake mode
        thread = threading.Thread(target=_trace_in_background, name="cstream-trace-warmup",
                                  daemon=True)
        thread.start()
        _thread = thread  # wait() joins only a started thread, even after a Ctrl-C in start()


def wait() -> None:
    if _thread is not None:
        _thread.join()
