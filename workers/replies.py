"""What an input worker's ``fetch`` brings back, as the consumer's side reads it.

On the wire a reply is the worker's dict (:func:`workers.wire.unpack_reply` rebuilds its
batches); :func:`replies_of` turns it into :class:`WorkerReply` items, one per batch, error or
request for numbers, and nothing past that point reads a key or a kind string.

>>> r = WorkerReply.of({"kind": "batch", "index": 3, "batch": 7, "nbytes": 8,
...                     "after": WorkerPosition(4)})
>>> r.kind is ReplyKind.BATCH, r.index, r.nbytes
(True, 3, 8)
>>> WorkerReply.failure("RuntimeError", "lost", "in transport").kind
<ReplyKind.ERROR: 'error'>
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional

from workers.positions import WorkerPosition
from workers.wire import unpack_reply

__all__ = ["ReplyKind", "WorkerReply", "replies_of"]


class ReplyKind(enum.Enum):
    BATCH = "batch"
    """A produced batch."""
    ERROR = "error"
    """The worker failed (``input_fn`` raised, or the transport did); :attr:`WorkerReply.error`
    says how."""
    NEED_NUMBERS = "need_numbers"
    """Dynamic assignment: the worker's loader waits for more global batch numbers with
    :attr:`WorkerReply.drawn_ahead` batches drawn and not produced."""


@dataclass(eq=False)
class WorkerReply:
    """One item of a worker's reply."""

    kind: ReplyKind
    index: Optional[int]
    """The worker's own batch count of this item (batch ``index`` of the worker)."""
    batch: Any = None
    nbytes: int = 0
    after: Optional[WorkerPosition] = None
    """The worker's position after this batch."""
    produce_s: Optional[float] = None
    produced_unix: Optional[tuple] = None
    produce_cpu_s: Optional[float] = None
    received_unix: Optional[float] = None
    number: Optional[int] = None
    """Dynamic assignment: the global batch this batch is (a failure: the one it was for)."""
    idle_s: float = 0.0
    """Dynamic assignment: how long the worker waited for this batch's number."""
    keys: Optional[dict] = None
    drawn_ahead: int = 0
    error: Optional[dict] = None
    """A failure's ``exc_type``, ``exc_module``, ``exc_message``, ``traceback``, ``during``."""

    @classmethod
    def of(cls, item: dict) -> WorkerReply:
        """The item of an unpacked reply (its keys as :mod:`workers.input_worker` writes them)."""
        kind = ReplyKind(item["kind"])
        if kind is ReplyKind.ERROR:
            return cls(kind, item.get("index"), error={
                k: item.get(k, "") for k in ("exc_type", "exc_module", "exc_message",
                                              "traceback", "during")})
        if kind is ReplyKind.NEED_NUMBERS:
            return cls(kind, item["index"], drawn_ahead=int(item["drawn_ahead"]))
        return cls(kind, item["index"], batch=item.get("batch"), nbytes=item["nbytes"],
                   after=item["after"], produce_s=item.get("produce_s"),
                   produced_unix=item.get("produced_unix"),
                   produce_cpu_s=item.get("produce_cpu_s"), number=item.get("step"),
                   idle_s=item.get("idle_s", 0.0), keys=item.get("keys"))

    @classmethod
    def failure(cls, exc_type: str, message: str, during: str, *, traceback: str = "",
                index: Optional[int] = None) -> WorkerReply:
        """A failure the consumer's side found itself (a dead actor, a broken invariant)."""
        return cls(ReplyKind.ERROR, index, error={
            "exc_type": exc_type, "exc_module": "", "exc_message": message,
            "traceback": traceback, "during": during})

    @property
    def failed(self) -> bool:
        return self.kind is ReplyKind.ERROR

    def take_batch(self) -> Any:
        """The batch, handed over once (the reply keeps no reference to it)."""
        batch, self.batch = self.batch, None
        return batch


def replies_of(wire: dict, copy: bool) -> list[WorkerReply]:
    """The items of a ``fetch`` reply's body (see :func:`workers.wire.unpack_reply`
    for ``copy``)."""
    return [WorkerReply.of(item) for item in unpack_reply(wire, copy=copy)]
