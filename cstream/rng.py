"""The random stream of the training step, saved and restored like ``torch.get_rng_state``.

On the CPU backend the step draws from this process's generator; on the GPU backend from the
CUDA generator of its device (``torch.cuda.get_rng_state(device)``, a state of another size: a
state saved on one device is restored on that kind of device). On CSX the wafer has its own
generator: each run seeds it from this process's generator (so ``torch.manual_seed(s)`` before
a run fixes every dropout mask), and hands its final state back when the run ends.

>>> import torch, cstream
>>> b = cstream.backend("CPU")
>>> state = cstream.get_rng_state()
>>> a = torch.rand(2)
>>> cstream.set_rng_state(state)
>>> torch.equal(a, torch.rand(2))
True
>>> b.shutdown()
"""

from __future__ import annotations

import torch

from executor import runtime


def get_rng_state() -> torch.Tensor:
    """The step's generator state (a uint8 tensor, as ``torch.get_rng_state()``).

    Inside a :func:`cstream.checkpoint_closure` on CSX it is the wafer's state after that step,
    so a checkpoint that saves it lets a resumed run draw the same random numbers (dropout
    masks) as the uninterrupted one.
    """
    backend = runtime.current_backend()
    return torch.get_rng_state() if backend is None else backend.get_rng_state()


def set_rng_state(state: torch.Tensor) -> None:
    """Restore a state from :func:`get_rng_state`; the next run's step continues from it."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise TypeError(
            f"cstream.set_rng_state expects the uint8 tensor cstream.get_rng_state() returned "
            f"(e.g. checkpoint['rng_state']), got {type(state).__name__}"
            + (f" of dtype {state.dtype}" if isinstance(state, torch.Tensor) else "") + ".")
    backend = runtime.current_backend()
    if backend is None:
        torch.set_rng_state(state)
    else:
        backend.set_rng_state(state)


def manual_seed(seed: int) -> None:
    """Seed the step's random numbers: this process's generators (``torch.manual_seed``: the
    CPU's and every CUDA device's) and, where a backend exists, its generator (the wafer's on
    CSX) with the same state."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"cstream.manual_seed expects an int seed, got {seed!r}.")
    backend = runtime.current_backend()
    if backend is None:
        torch.manual_seed(seed)
    else:
        backend.manual_seed(seed)
