"""Where input workers and streams are, as typed values, and the one round-robin formula.

- :class:`WorkerPosition`: where one worker is (or starts): after ``worker_step`` of its own
  batches, having streamed ``samples_streamed`` samples, at ``loader`` (the loader's position,
  :mod:`workers.resume`'s format). A reply carries the worker's position after each batch;
  a worker is started at one.
- :class:`StreamPosition`: where one CS-X's stream is: the global batch it delivers next and
  each worker's position; it is what a checkpoint stores
  (:class:`~workers.context.DataLoaderCheckpoint`, one per worker: the format on disk).
- :class:`RoundRobinOrder`: step ``s`` of a CS-X comes from worker ``s % W``; worker ``w``'s
  batch ``i`` is global batch ``i * W + w``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from workers.context import DataLoaderCheckpoint

__all__ = ["RoundRobinOrder", "StreamPosition", "WorkerPosition", "start_position"]


def start_position() -> dict:
    """The loader position of a worker that has streamed nothing."""
    return {"epoch": 0, "batch_in_epoch": 0}


@dataclass(frozen=True)
class RoundRobinOrder:
    """The round-robin (static) order of one CS-X's ``num_workers`` workers.

    >>> order = RoundRobinOrder(3)
    >>> [order.worker_of(s) for s in range(5)], order.global_batch(2, 4)
    ([0, 1, 2, 0, 1], 14)
    >>> [order.batches_of(w, 5) for w in range(3)], order.steps_after(2, 5)
    ([2, 2, 1], 15)
    """

    num_workers: int

    def worker_of(self, step: int) -> int:
        """The worker that produces global batch ``step``."""
        return step % self.num_workers

    def global_batch(self, w: int, index: int) -> int:
        """The global batch that is worker ``w``'s batch ``index`` (both from 0)."""
        return index * self.num_workers + w

    def batches_of(self, w: int, total: int) -> int:
        """Batches worker ``w`` delivered once the CS-X took ``total`` steps."""
        return (total - w + self.num_workers - 1) // self.num_workers

    def steps_after(self, w: int, worker_step: int) -> int:
        """The CS-X's step count once worker ``w`` delivered ``worker_step`` batches."""
        return 0 if worker_step == 0 else self.global_batch(w, worker_step - 1) + 1


@dataclass(frozen=True)
class WorkerPosition:
    """Where one input worker is in its data (see the module docstring). Never changed once
    made: a reply and the worker's state may share one."""

    worker_step: int = 0
    samples_streamed: int = 0
    loader: dict = field(default_factory=start_position)

    @classmethod
    def of_checkpoint(cls, state: DataLoaderCheckpoint) -> WorkerPosition:
        """The position a saved checkpoint describes (its loader position as it is)."""
        return cls(int(state.worker_step), int(state.samples_streamed),
                   state.user_state_dict or start_position())

    def joined(self) -> WorkerPosition:
        """A worker that joins a stream at this place in the data: its own counts from 0."""
        return WorkerPosition(0, 0, self.loader)

    def checkpoint(self, local_worker_id: int, num_workers: int, num_csx: int, wse_id: int,
                   appliance_step: int, worker_step: int | None = None) -> DataLoaderCheckpoint:
        """This position stored for worker ``local_worker_id`` of ``num_workers``
        (``worker_step``: another count than this position's, a round-robin one)."""
        return DataLoaderCheckpoint(
            local_worker_id=local_worker_id, num_workers_per_csx=num_workers, num_csx=num_csx,
            wse_id=wse_id, appliance_step=appliance_step,
            worker_step=self.worker_step if worker_step is None else worker_step,
            samples_streamed=self.samples_streamed, user_state_dict=copy.deepcopy(self.loader))


@dataclass(frozen=True)
class StreamPosition:
    """Where one CS-X's stream is: ``step``, the global batch it delivers next, and
    ``workers``, each worker's position after the batches it delivered (round-robin: worker
    ``w`` delivered ``RoundRobinOrder(W).batches_of(w, step)``)."""

    step: int
    workers: tuple[WorkerPosition, ...]

    @property
    def order(self) -> RoundRobinOrder:
        return RoundRobinOrder(len(self.workers))

    def checkpoints(self, num_csx: int, wse_id: int) -> list[DataLoaderCheckpoint]:
        """One checkpoint per worker, as ``worker_states()`` returns them."""
        return [p.checkpoint(w, len(self.workers), num_csx, wse_id, self.step)
                for w, p in enumerate(self.workers)]

    @classmethod
    def shared(cls, step: int, at: WorkerPosition, num_workers: int) -> StreamPosition:
        """Every worker at ``at`` (dynamic assignment: the position after the last delivered
        batch is every worker's), with the ``worker_step`` counts of a round-robin stream at
        ``step``, so that it resumes in either mode."""
        order = RoundRobinOrder(num_workers)
        return cls(step, tuple(WorkerPosition(order.batches_of(w, step), at.samples_streamed,
                                              at.loader) for w in range(num_workers)))
