"""Errors and warnings of the input side.

They travel between processes (an input stream may live inside the wafer driver's Ray actor and
its errors are re-raised in the client), so every class pickles with all of its fields.
"""

from __future__ import annotations

import os
import threading
import traceback

from workers.positions import RoundRobinOrder


def _where(wse_id: int, local_worker_id: int, num_workers_per_csx: int | None = None) -> str:
    where = f"CS-X {wse_id}, input worker {local_worker_id}"
    if num_workers_per_csx is not None:
        where += f" of {num_workers_per_csx}"
    return where


_PACKAGE_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
    for d in ("workers", "executor", "cstream"))


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as the user's code sees it: the frames of cstream's own input
    machinery (and of the thread that runs it) above the first frame outside it are left out.
    Chained exceptions of the user's (``raise ... from ...``) are kept."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIRS)
                              or tb.tb_frame.f_code.co_filename == threading.__file__):
        tb = tb.tb_next
    if tb is None:  # raised by cstream itself: keep everything
        tb = exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb))


class InputWorkerError(RuntimeError):
    """``input_fn`` (or the dataloader it returned) raised inside an input worker.

    The first line names the CS-X, the worker, the global batch the failed batch was for
    (0-based, counted across epochs: the wafer consumes global batch ``g`` at step ``g + 1``),
    that step, the worker's own count of its batches and the user's exception; the user's
    own traceback from the worker follows. Every field travels with the exception (it pickles
    whole).

    ``global_batch`` comes from the stream, which knows which global batch each worker was
    making: under dynamic assignment the number the coordinator gave it. Where it is not
    given, the round-robin (static) formula is used: worker ``w``'s batch ``i`` is global
    batch ``i * num_workers_per_csx + w``.

    >>> e = InputWorkerError(0, 2, "ValueError", "bad row", "Traceback ...", "while producing",
    ...                      num_workers_per_csx=3, batch=3, global_batch=13)
    >>> head, _, rest = str(e).splitlines()[0].partition(": ")
    >>> head
    "CS-X 0, input worker 2 of 3, global batch 13 (step 14, the worker's batch 3)"
    >>> rest
    'input_fn failed while producing: ValueError: bad row'
    >>> InputWorkerError(0, 1, "ValueError", "bad row", "", num_workers_per_csx=3, batch=4).step
    14
    """

    def __init__(self, wse_id: int, local_worker_id: int, exc_type: str, exc_message: str,
                 traceback_text: str, during: str = "", num_workers_per_csx: int | None = None,
                 batch: int | None = None, global_batch: int | None = None):
        self.wse_id = wse_id
        self.local_worker_id = local_worker_id
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback_text = traceback_text
        self.during = during
        self.num_workers_per_csx = num_workers_per_csx
        self.batch = batch
        if global_batch is None and batch is not None and num_workers_per_csx is not None:
            global_batch = RoundRobinOrder(num_workers_per_csx).global_batch(local_worker_id,
                                                                             batch)
        self.global_batch = global_batch
        head = _where(wse_id, local_worker_id, num_workers_per_csx)
        if global_batch is not None:
            head += f", global batch {global_batch} (step {global_batch + 1}"
            head += ")" if batch is None else f", the worker's batch {batch})"
        elif batch is not None:
            head += f", the worker's batch {batch}"
        head += ": input_fn failed"
        if during:
            head += f" {during}"
        first, _, rest = str(exc_message).partition("\n")
        text = f"{head}: {exc_type}: {first}"
        if rest:
            text += f"\n{rest}"
        text += f"\nThe input stream of CS-X {wse_id} was stopped and its workers were shut down."
        if traceback_text.strip():
            text += ("\ninput_fn's traceback, in the input worker:\n"
                     + traceback_text.rstrip())
        super().__init__(text)

    @property
    def step(self) -> int | None:
        """The CS-X step (from 1) the failed batch was for, where known."""
        return None if self.global_batch is None else self.global_batch + 1

    def __reduce__(self):
        return (type(self), (self.wse_id, self.local_worker_id, self.exc_type, self.exc_message,
                             self.traceback_text, self.during, self.num_workers_per_csx,
                             self.batch, self.global_batch))


class WorkerCrashLoopError(RuntimeError):
    """An input worker's process died more often than ``CSConfig.max_worker_restarts`` allows.

    >>> str(WorkerCrashLoopError(1, 0, 4, 3, "killed")).startswith("CS-X 1, input worker 0")
    True
    """

    def __init__(self, wse_id: int, local_worker_id: int, restarts: int, max_restarts: int,
                 cause: str):
        self.wse_id = wse_id
        self.local_worker_id = local_worker_id
        self.restarts = restarts
        self.max_restarts = max_restarts
        self.cause = cause
        super().__init__(
            f"{_where(wse_id, local_worker_id)} died {restarts} times, more than "
            f"CSConfig.max_worker_restarts={max_restarts} allows, so the run was stopped. "
            f"Last cause: {cause}\n"
            "An input worker that keeps dying usually runs out of memory or crashes in native "
            "code inside input_fn; check the worker logs, lower the batch size or the number of "
            "workers per CS-X, or raise max_worker_restarts if the crashes are transient."
        )

    def __reduce__(self):
        return (type(self), (self.wse_id, self.local_worker_id, self.restarts,
                             self.max_restarts, self.cause))


class StragglerWarning(UserWarning):
    """An input worker delivered nothing for ``CSConfig.straggler_timeout_s`` seconds."""


class UnshardedInputWarning(UserWarning):
    """Several input workers streamed the same samples: ``input_fn`` does not shard its data
    (see :mod:`workers.duplicates`)."""


class UnshardedInputError(ValueError):
    """Several input workers streamed the same samples and
    ``CSConfig(duplicate_samples="error")`` asked for an error.

    >>> import pickle
    >>> e = UnshardedInputError("input_fn f streams the same samples on 4 input workers", 4)
    >>> e.times, str(pickle.loads(pickle.dumps(e))) == str(e)
    (4, True)
    """

    def __init__(self, message: str, times: int):
        self.times = times
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.times))


class AutoscaleError(ValueError):
    """An autoscaled run (``CSConfig.num_workers_per_csx="auto"``) cannot start: its input side
    cannot change its workers while it runs and keep the wafer's sequence exact."""
