"""Which shard am I? The worker context seen by ``input_fn``.

Inside an input worker, :func:`get_worker_info` tells the user's ``input_fn`` which CS-X it feeds
and which worker of that CS-X it is; in the client and on the CPU backend it reports worker 0 of 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerInfo:
    """Identity of one input worker (names follow the Cerebras ``DataLoaderCheckpoint``)."""

    local_worker_id: int = 0
    num_workers_per_csx: int = 1
    num_csx: int = 1
    wse_id: int = 0

    @property
    def global_worker_id(self) -> int:
        return self.wse_id * self.num_workers_per_csx + self.local_worker_id

    @property
    def total_num_workers(self) -> int:
        return self.num_csx * self.num_workers_per_csx


@dataclass
class DataLoaderCheckpoint:
    """The state of one input worker at a checkpoint step (Cerebras API names)."""

    local_worker_id: int = 0
    num_workers_per_csx: int = 1
    num_csx: int = 1
    wse_id: int = 0
    appliance_step: int = 0
    worker_step: int = 0
    samples_streamed: int = 0
    user_state_dict: dict = field(default_factory=dict)

    @property
    def global_worker_id(self) -> int:
        return self.wse_id * self.num_workers_per_csx + self.local_worker_id

    @property
    def total_num_workers(self) -> int:
        return self.num_csx * self.num_workers_per_csx


_DEFAULT = WorkerInfo()
_local = threading.local()


def get_worker_info() -> WorkerInfo:
    """Return the calling input worker's identity (worker 0 of 1 outside a worker)."""
    return getattr(_local, "info", _DEFAULT)


def get_worker_state() -> DataLoaderCheckpoint:
    """Return the calling worker's streaming state (inside a checkpoint's state gathering)."""
    state = getattr(_local, "state", None)
    if state is None:
        info = get_worker_info()
        state = DataLoaderCheckpoint(
            local_worker_id=info.local_worker_id,
            num_workers_per_csx=info.num_workers_per_csx,
            num_csx=info.num_csx,
            wse_id=info.wse_id,
        )
    return state


@contextlib.contextmanager
def samples_streamed_this_run(count: int):
    """Inside the block ``get_worker_state().samples_streamed`` is ``count``, the samples the
    calling worker streamed since this run started (a loader's ``state_dict()`` adds what an
    earlier part of the run streamed itself, as the Cerebras ``RestartableDataLoader`` does)."""
    prev = getattr(_local, "state", None)
    _local.state = dataclasses.replace(get_worker_state(), samples_streamed=int(count))
    try:
        yield
    finally:
        _local.state = prev


@contextlib.contextmanager
def worker_context(info: WorkerInfo, state: DataLoaderCheckpoint | None = None):
    """Run a block as the given worker: ``get_worker_info()`` returns ``info`` inside it."""
    prev_info = getattr(_local, "info", _DEFAULT)
    prev_state = getattr(_local, "state", None)
    _local.info = info
    _local.state = state
    try:
        yield info
    finally:
        _local.info = prev_info
        _local.state = prev_state


_streamer = threading.local()


def is_streamer() -> bool:
    """True inside an input worker of the CSX backend (its thread, and the DataLoader worker
    processes forked from it); False in the client, on the CPU backend too."""
    return getattr(_streamer, "value", False)


@contextlib.contextmanager
def streamer_context():
    """Run a block as an input worker's streaming task (see :func:`is_streamer`)."""
    prev = getattr(_streamer, "value", False)
    _streamer.value = True
    try:
        yield
    finally:
        _streamer.value = prev


class AssignmentClosed(Exception):
    """The worker stops: no more global batch numbers will be assigned."""


class BatchAssignment:
    """The global batch numbers a coordinator assigned to one input worker (dynamic assignment).

    The worker's stream sends numbers with :meth:`extend` (in sends numbered 0, 1, 2, ... so
    that sends overtaking each other are applied in order); a sampler that takes part in
    dynamic assignment (:class:`workers.sharding.ShardedSampler`) reads them with :meth:`peek`
    and :meth:`take`, and the worker pairs each batch it produces with :meth:`pop_taken`.
    Numbers count global batches across epochs: number ``s`` is the batch the wafer consumes
    at step ``s`` (global batch ``s % n`` of epoch ``s // n`` for ``n`` batches an epoch).

    A loader that draws index batches ahead of the batch it yields (a torch ``DataLoader``
    with worker processes, a prefetching sampler wrapper) asks for numbers before it produces
    the batches of the numbers it took. When :meth:`peek` has to wait with numbers taken and
    not yet produced, :attr:`waiting_ahead` says how many (0 otherwise) and ``on_wait_ahead``
    is called: the worker tells its coordinator, which then grants it that many numbers
    beyond the one it produces.
    """

    def __init__(self, on_wait_ahead=None):
        self._cond = threading.Condition()
        self._numbers: list[int] = []  # assigned, not yet taken, in increasing order
        self._taken: list[int] = []  # taken by the sampler, batch not yet produced
        self._sends: dict[int, list[int]] = {}  # sends that arrived before an earlier one
        self._next_send = 0
        self._closed = False
        self.idle_s = 0.0  # time spent waiting for a number (not producing)
        self.waiting_ahead = 0  # numbers taken and not produced while peek() waits
        self._on_wait_ahead = on_wait_ahead

    def extend(self, send: int, numbers: list[int]) -> None:
        with self._cond:
            self._sends[int(send)] = [int(n) for n in numbers]
            while self._next_send in self._sends:
                self._numbers.extend(self._sends.pop(self._next_send))
                self._next_send += 1
            self._cond.notify_all()

    def peek(self) -> int:
        """The next assigned number (waits for one); raises :class:`AssignmentClosed`."""
        with self._cond:
            if not self._numbers:
                t0 = time.perf_counter()
                if self._taken:  # the loader draws ahead of what it yielded
                    self.waiting_ahead = len(self._taken)
                    if self._on_wait_ahead is not None:
                        self._on_wait_ahead()
                try:
                    while not self._numbers:
                        if self._closed:
                            raise AssignmentClosed()
                        self._cond.wait(0.5)
                finally:
                    self.waiting_ahead = 0
                self.idle_s += time.perf_counter() - t0
            return self._numbers[0]

    def take(self) -> int:
        """Take the number :meth:`peek` returned: the sampler yields its batch."""
        with self._cond:
            n = self._numbers.pop(0)
            self._taken.append(n)
            return n

    def pop_taken(self) -> int | None:
        """The number of the oldest batch taken and not yet paired with a produced batch."""
        with self._cond:
            return self._taken.pop(0) if self._taken else None

    def pending(self) -> list[int]:
        with self._cond:
            return list(self._taken) + list(self._numbers)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


_assignment = threading.local()


def get_batch_assignment() -> BatchAssignment | None:
    """The calling input worker's :class:`BatchAssignment`, or None when its batches are
    assigned statically (round-robin)."""
    return getattr(_assignment, "value", None)


@contextlib.contextmanager
def batch_assignment(assignment: BatchAssignment | None):
    """Run a block with ``assignment`` as the worker's source of global batch numbers."""
    prev = getattr(_assignment, "value", None)
    _assignment.value = assignment
    try:
        yield assignment
    finally:
        _assignment.value = prev
