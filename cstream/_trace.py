"""``@cstream.trace`` / ``@cstream.compile_step``: mark the function that is one step."""

from __future__ import annotations

import contextlib
import functools

from executor import runtime


def _one_step(fn):
    """``fn`` with what every step does around the user's code (run eagerly, or traced): the
    schedulers' param group values of this step (:func:`group_values_in_step`) and the hooks
    of :mod:`cstream.core.compile`; the backend's ``is_tracing`` is True meanwhile."""
    @functools.wraps(fn)
    def step(*args, **kwargs):
        from cstream.core.compile import run_post_hooks, run_pre_hooks
        from cstream.optim.scheduler import group_values_in_step

        backend = runtime.current_backend()
        with group_values_in_step():
            if backend is not None:
                backend.is_tracing = True
            try:
                run_pre_hooks()
                out = fn(*args, **kwargs)
                run_post_hooks()
            finally:
                if backend is not None:
                    backend.is_tracing = False
            return out

    return step


class TracedStep:
    """A user step function. On eager backends calling it runs the function; on CSX it is
    traced once into a static graph and replayed (see :mod:`executor.engine`). ``fn`` is what
    the backends run or trace: the user's function within the step's set-up."""

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"cstream.trace expects a function, got {type(fn).__name__}.")
        self.user_fn = fn
        self.fn = _one_step(fn)
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):
        """A decorated method: the step bound to ``obj``, made once per object and kept in its
        ``__dict__`` (so the CSX backend traces it once, as a function)."""
        if obj is None:
            return self
        bound = TracedStep(functools.partial(self.user_fn, obj))
        name = getattr(self.user_fn, "__name__", None)
        if name is not None and hasattr(obj, "__dict__"):
            obj.__dict__[name] = bound
        return bound

    def __call__(self, *args, **kwargs):
        from workers.dataloader import DataLoader

        for a in (*args, *kwargs.values()):
            if isinstance(a, DataLoader):
                raise TypeError(
                    f"{self!r} was called with the cstream DataLoader itself; a step takes one "
                    "batch. Iterate the executor and pass its batch: "
                    "`for batch in executor: loss = training_step(batch)`."
                )
        backend = runtime.current_backend(required=True)
        return backend.run_step(self, args, kwargs)

    def run(self, *args, **kwargs):
        """The user's function under what every backend runs a step with: the acceptance of
        :mod:`executor.engine.accept` (int32 labels; on an eager backend only for a step given
        narrow integer tensors, :func:`~executor.engine.accept.needs_accept_mode`) and, when
        mixed precision is on, autocast (:mod:`cstream.amp.precision`). The eager backends call
        it, the CSX backend traces it."""
        from cstream.amp.precision import step_autocast
        from executor.engine.accept import AcceptMode, needs_accept_mode

        backend = runtime.current_backend(required=True)
        accept = AcceptMode() if backend.is_csx or needs_accept_mode((args, kwargs)) \
            else contextlib.nullcontext()
        with accept, step_autocast(backend, (args, kwargs)):
            return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<cstream.trace {getattr(self.fn, '__qualname__', self.fn)!r}>"


def trace(fn):
    """Decorate the function holding one whole training or evaluation step.

    The function is traced once into a static graph on the CSX backend (Python side effects
    happen once; branches and loops are fixed at trace time), and run eagerly on CPU.
    """
    return TracedStep(fn)


compile_step = trace
