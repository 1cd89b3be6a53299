"""A checkpoint step's state, fetched from the wafer driver's snapshot of that step in pieces.

A save reads the state tensors one after another; fetched in one call, the whole state would
cross from the driver before the first tensor is written. Fetched in pieces of about
:data:`PIECE_BYTES` in the store's order (the order a state dict lists them), the next piece is
on its way while the caller writes the one before: the fetch and the write overlap.
"""

from __future__ import annotations

from executor.engine.handles import Slot

PIECE_BYTES = 64 << 20
"""About this much state a call: large enough that a call's own cost (~1 ms on Ray) is small
beside moving its bytes, small enough that the first piece arrives soon."""


def _nbytes(slot: Slot) -> int:
    v = slot.value
    return v.numel() * v.element_size()


class SnapshotFetch:
    """The values of ``slots`` at ``step``, read from ``driver.snapshot`` piece by piece: reading
    one fetches its piece (waiting for it) and starts fetching the next. A value read stays here
    until the checkpoint closure ends (it may be read again)."""

    def __init__(self, driver, step: int, slots: list[Slot], piece_bytes: int | None = None):
        self.driver, self.step = driver, step
        self.pieces: list[list[int]] = []
        piece_bytes = PIECE_BYTES if piece_bytes is None else piece_bytes
        size = piece_bytes
        for s in slots:
            if size >= piece_bytes:
                self.pieces.append([])
                size = 0
            self.pieces[-1].append(s.key)
            size += _nbytes(s)
        self.piece_of = {k: i for i, piece in enumerate(self.pieces) for k in piece}
        self.values: dict = {}
        self.on_the_way: dict = {}  # piece index -> Future of its values
        self.calls = 0

    def read(self, slot: Slot):
        if slot.key not in self.values:
            i = self.piece_of.get(slot.key)
            if i is None:  # not state when the closure began: read on its own
                self.values.update(self.driver.snapshot(self.step, [slot.key]))
                self.calls += 1
            else:
                self._start(i)
                self.values.update(self.on_the_way.pop(i).result())
                self._start(i + 1)
        return self.values[slot.key]

    def _start(self, i: int) -> None:
        if i < len(self.pieces) and i not in self.on_the_way and \
                self.pieces[i][0] not in self.values:
            self.on_the_way[i] = self.driver.snapshot_async(self.step, self.pieces[i])
            self.calls += 1

    def close(self) -> None:
        """Let the values go; a piece still on its way is not waited for (nothing reads it)."""
        self.on_the_way.clear()
        self.values.clear()
