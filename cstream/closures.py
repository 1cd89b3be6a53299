"""Step closures and checkpoint closures."""

from __future__ import annotations

import functools

from executor import runtime


def step_closure(fn):
    """Run ``fn`` at the end of the current step, with its tensor arguments materialised.

    On the CSX backend the client runs ahead of the wafer; a step closure waits until the wafer
    has finished the step and fetches the tensors it was given (their last value in the step).
    Outside an executor the function is called immediately.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        executor = runtime.current_executor()
        if executor is None:
            return fn(*args, **kwargs)
        executor.queue_closure(fn, args, kwargs)
        return None

    wrapper.__cstream_closure__ = "step"
    return wrapper


def checkpoint_closure(fn):
    """A step closure that only runs on checkpoint steps (``checkpoint_steps`` of the executor,
    and always the final step); on other steps calling it does nothing. Inside it, the model's
    and optimizer's ``state_dict()`` hold the values at that step.

    Called before a run (the Model Zoo's ``save_initial_checkpoint``), it runs when the next
    DataExecutor starts iterating, before its first step, with the initial values."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        executor = runtime.current_executor()
        if executor is None:
            backend = runtime.current_backend()
            if backend is None:
                raise RuntimeError(
                    f"checkpoint closure {fn.__qualname__} was called with no backend and no "
                    "DataExecutor run. Create the backend first; called before a run, the "
                    "closure runs as the next DataExecutor starts, before its first step.")
            backend.initial_closures.append((fn, args, kwargs))
            return None
        if not executor.on_checkpoint_step:
            return None
        executor.queue_closure(fn, args, kwargs, checkpoint=True)
        return None

    wrapper.__cstream_closure__ = "checkpoint"
    return wrapper


def current_executor():
    """The DataExecutor being iterated, or None."""
    return runtime.current_executor()
