"""Errors and warnings of the input side.

They travel between processes (an input stream may live inside the wafer driver's Ray actor and
its errors are re-raised in the client), so every class pickles with all of its fields.
"""

from __future__ import annotations


def _where(wse_id: int, local_worker_id: int, num_workers_per_csx: int | None = None) -> str:
    where = f"CS-X {wse_id}, input worker {local_worker_id}"
    if num_workers_per_csx is not None:
        where += f" of {num_workers_per_csx}"
    return where


class InputWorkerError(RuntimeError):
    """``input_fn`` (or the dataloader it returned) raised inside an input worker.

    Carries the original exception's type name, message and the full traceback text from the
    worker, so the failure can be read where it surfaces (the client), not only in worker logs.

    >>> e = InputWorkerError(0, 1, "ValueError", "bad row", "Traceback ...", "while building")
    >>> "CS-X 0, input worker 1" in str(e) and "ValueError: bad row" in str(e)
    True
    """

    def __init__(self, wse_id: int, local_worker_id: int, exc_type: str, exc_message: str,
                 traceback_text: str, during: str = "", num_workers_per_csx: int | None = None):
        self.wse_id = wse_id
        self.local_worker_id = local_worker_id
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.traceback_text = traceback_text
        self.during = during
        self.num_workers_per_csx = num_workers_per_csx
        head = f"{_where(wse_id, local_worker_id, num_workers_per_csx)}: input_fn failed"
        if during:
            head += f" {during}"
        super().__init__(
            f"{head}: {exc_type}: {exc_message}\n"
            f"The input stream of CS-X {wse_id} was stopped and its workers were shut down.\n"
            f"Original traceback (in the input worker):\n{traceback_text.rstrip()}"
        )

    def __reduce__(self):
        return (type(self), (self.wse_id, self.local_worker_id, self.exc_type, self.exc_message,
                             self.traceback_text, self.during, self.num_workers_per_csx))


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
    """Every input worker of a CS-X streamed the same first batch: ``input_fn`` does not shard."""
