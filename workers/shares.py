"""What one input worker produces under each assignment: the worker's side of
:mod:`workers.assignment` and :mod:`workers.coordinator`, chosen once its loader is built.

- :class:`RoundRobinShare`: its round-robin shard, in order (static assignment).
- :class:`NumberedShare`: the global batches whose numbers its coordinator gives it (dynamic
  assignment, :class:`~workers.context.BatchAssignment`); every batch carries its number.

Before the loader is built, a worker asked for dynamic assignment holds a
:class:`RequestedShare`: numbers sent meanwhile (after a restart) are kept, and
:meth:`RequestedShare.decide` makes it a numbered share where the loader can take part
(:func:`workers.loaders.dynamic_assignment_support`), a round-robin one otherwise. The actor
asks its share alone, never which kind it is.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional, Protocol

from workers.context import BatchAssignment, batch_assignment
from workers.loaders import (draws_ahead, dynamic_assignment_support, global_batches_per_epoch,
                             worker_change_support)
from workers.positions import RoundRobinOrder

__all__ = ["NumberedShare", "RequestedShare", "RoundRobinShare", "Share", "share_for"]


class Share(Protocol):
    mode: str  # "static", "dynamic" or "failed" (the loader could not be built)
    why: str
    draws_ahead: int  # index batches the loader draws ahead of the one it yields
    batches_per_epoch: Optional[int]  # numbered: global batches of an epoch
    change_support: tuple[bool, str]  # workers.loaders.worker_change_support of the loader

    def start(self, position: dict) -> dict:
        """The loader position the worker starts from, given the one it was started at."""

    def producing(self):
        """A context the producer runs in (the sampler finds its numbers there)."""

    def idle_s(self) -> float:
        """The time spent waiting for numbers so far."""

    def stamp(self, item: dict, idle_s: float) -> int:
        """Mark the produced ``item`` as the share's (its number, the wait for it); returns
        the CS-X step count once it is consumed."""

    def waiting_ahead(self) -> int:
        """Numbers taken and not produced while the loader waits for more (0 otherwise)."""

    def assign(self, send: int, numbers: list) -> None:
        """Numbers from the coordinator (ignored by a round-robin share)."""

    def close(self) -> None:
        """The worker stops."""


class RoundRobinShare:
    """Static assignment: worker ``w`` of ``W`` makes its own shard in order; its batch ``i``
    is consumed at step ``i * W + w + 1``."""

    mode = "static"
    draws_ahead = 0
    batches_per_epoch = None

    def __init__(self, w: int, num_workers: int, why: str,
                 change_support: tuple[bool, str] = (False, "the dataloader was not built")):
        self.w, self.order, self.why = w, RoundRobinOrder(num_workers), why
        self.change_support = change_support

    def start(self, position: dict) -> dict:
        return position

    def producing(self):
        return contextlib.nullcontext()

    def idle_s(self) -> float:
        return 0.0

    def stamp(self, item: dict, idle_s: float) -> int:
        return self.order.steps_after(self.w, item["index"] + 1)

    def waiting_ahead(self) -> int:
        return 0

    def assign(self, send: int, numbers: list) -> None:
        pass

    def close(self) -> None:
        pass


class FailedShare(RoundRobinShare):
    """The loader could not be built: ``fetch`` replies with the error."""

    mode = "failed"


class NumberedShare:
    """Dynamic assignment: the worker makes the global batches whose numbers it is given,
    starting from ``dynamic_start`` (a loader position; None: the one it was started at)."""

    mode = "dynamic"

    def __init__(self, numbers: BatchAssignment, loader, why: str,
                 dynamic_start: Optional[dict]):
        self.numbers, self.why = numbers, why
        self.draws_ahead = draws_ahead(loader)
        self.batches_per_epoch = global_batches_per_epoch(loader)
        self.change_support = worker_change_support(loader)
        self.dynamic_start = dynamic_start

    def start(self, position: dict) -> dict:
        return position if self.dynamic_start is None else self.dynamic_start

    def producing(self):
        return batch_assignment(self.numbers)

    def idle_s(self) -> float:
        return self.numbers.idle_s

    def stamp(self, item: dict, idle_s: float) -> int:
        number = self.numbers.pop_taken()
        item["step"] = number
        item["idle_s"] = idle_s  # waited for this batch's number
        return number + 1

    def waiting_ahead(self) -> int:
        return self.numbers.waiting_ahead

    def assign(self, send: int, numbers: list) -> None:
        self.numbers.extend(send, numbers)

    def close(self) -> None:
        self.numbers.close()


class RequestedShare:
    """Dynamic assignment asked for, the loader not built yet: numbers are kept until
    :meth:`decide`."""

    mode = "requested"

    def __init__(self, on_wait_ahead: Callable[[], None], dynamic_start: Optional[dict]):
        self.numbers = BatchAssignment(on_wait_ahead)
        self.dynamic_start = dynamic_start

    def assign(self, send: int, numbers: list) -> None:
        self.numbers.extend(send, numbers)

    def waiting_ahead(self) -> int:
        return 0

    def close(self) -> None:
        self.numbers.close()

    def decide(self, loader, w: int, num_workers: int) -> Share:
        ok, why = dynamic_assignment_support(loader)
        if ok:
            return NumberedShare(self.numbers, loader, why, self.dynamic_start)
        return RoundRobinShare(w, num_workers, why, worker_change_support(loader))


class StaticRequest(RoundRobinShare):
    """Static assignment asked for, the loader not built yet."""

    mode = "requested"

    def decide(self, loader, w: int, num_workers: int) -> Share:
        return RoundRobinShare(w, num_workers, "static assignment was asked for",
                               worker_change_support(loader))


def share_for(dynamic: bool, w: int, num_workers: int, on_wait_ahead: Callable[[], None],
              dynamic_start: Optional[dict]):
    """The share of a worker before its loader is built (it has :meth:`decide`)."""
    if dynamic:
        return RequestedShare(on_wait_ahead, dynamic_start)
    return StaticRequest(w, num_workers, "static assignment was asked for")
