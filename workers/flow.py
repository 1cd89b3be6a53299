"""FlowPolicy: every bound on data in flight between the input workers, the wafer and the client.

One object, built once per run from the user's :class:`~workers.config.CSConfig` and the CSX
backend's options, and handed to each part that needs a bound (the input streams, the wafer's
input feed, the wafer loop, the client). Field names carry their units.

>>> from workers.config import CSConfig
>>> p = FlowPolicy.from_config(CSConfig(input_buffer_batches=2), lookahead_steps=8)
>>> p.input_buffer_batches, p.lookahead_steps, p.batches_per_fetch
(2, 8, 4)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from workers.checks import positive_int
from workers.config import CSConfig

DEFAULT_LOOKAHEAD_STEPS = 64
_OPTIONAL_FIELDS = ("object_store_bytes", "input_bytes_in_flight_per_csx",
                    "reorder_window_batches_per_worker")


@dataclass(frozen=True)
class FlowPolicy:
    lookahead_steps: int = DEFAULT_LOOKAHEAD_STEPS
    """The wafer runs at most this many steps past the last step whose closures the client has
    finished; it is also the most step outputs the wafer keeps. A hard bound."""
    input_buffer_batches: int = 4
    """Batches each CS-X's input buffer on the wafer holds (filled by one feeder thread)."""
    batches_per_fetch: int = 4
    """The most batches an input worker sends in one reply (one Ray call, one object)."""
    small_batch_bytes: int = 256 * 1024
    """Batches smaller than this are sent up to ``small_reply_batches`` per reply: Ray's
    per-call and per-object cost (~1-2 ms of CPU across the worker, the raylet and the
    receiver) is more than a copy of them, so more per reply amortises it (100 KB batches,
    static assignment: ~27 per reply instead of 4 cut the input workers' and the raylet's CPU
    from ~1.5 to ~0.65 ms a step on the 2-core machine)."""
    small_reply_batches: int = 32
    """The most batches per reply when batches are small (see ``small_batch_bytes``)."""
    requests_in_flight_per_worker: int = 2
    """``fetch`` requests kept outstanding per input worker, so transport overlaps production."""
    assigned_batches_per_worker: int = 3
    """Dynamic assignment: global batch numbers an input worker holds at most (the one it
    produces and the ones queued behind it). Few, so that a worker stuck on a slow batch holds
    few others back; three, so that two are queued while a finished batch travels to the
    coordinator and the number that replaces it travels back. Cheap batches are held more at a
    time (``workers.coordinator.NumberBook.numbers_per_worker``)."""
    reorder_window_batches_per_worker: Optional[int] = None
    """Dynamic assignment: numbers are issued at most ``num_workers_per_csx`` x this beyond the
    last step the CS-X's stream delivered (the reorder window's bound, in batches; the byte
    bound applies as well). None: as many as one worker may run ahead under round-robin
    (``CsxInputStream.max_batches_ahead``), so the window holds what the workers' own buffers
    hold together under static assignment."""
    object_store_bytes: Optional[int] = None
    """Size of the embedded Ray object store; None: sized by :func:`object_store_bytes_for`."""
    input_bytes_in_flight_per_csx: Optional[int] = None
    """Bytes of one CS-X's batches in flight between its workers and its input buffer, split
    equally over the workers (``CSConfig.input_bytes_in_flight_per_csx``); None:
    :data:`OBJECT_STORE_SHARE_FOR_INPUT` of the object store, shared by the CS-Xs."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            positive_int(getattr(self, f.name), f"FlowPolicy.{f.name}",
                         allow_none=f.name in _OPTIONAL_FIELDS)

    @classmethod
    def from_config(cls, cs_config: CSConfig, lookahead_steps: int = DEFAULT_LOOKAHEAD_STEPS,
                    **overrides) -> "FlowPolicy":
        """The policy for ``cs_config`` (its input knobs) and the backend's look-ahead."""
        fields = dict(lookahead_steps=lookahead_steps,
                      input_buffer_batches=cs_config.input_buffer_batches,
                      batches_per_fetch=cs_config.batches_per_fetch,
                      input_bytes_in_flight_per_csx=cs_config.input_bytes_in_flight_per_csx)
        fields.update(overrides)
        return cls(**fields)

    def batches_per_reply(self, batch_bytes: int) -> int:
        """How many batches of ``batch_bytes`` one worker reply may carry."""
        if 0 < batch_bytes < self.small_batch_bytes:
            return max(self.batches_per_fetch, self.small_reply_batches)
        return self.batches_per_fetch

    def worker_buffer_batches(self, bytes_bounded: bool) -> int:
        """The most batches an input worker holds produced and not yet asked for: enough for
        the requests kept in flight and for a reply's worth; where a byte bound is in force
        and replies carry several batches, a reply's worth of small batches
        (:meth:`batches_per_reply`); the byte bound keeps large ones to what it allows.

        >>> FlowPolicy().worker_buffer_batches(bytes_bounded=False)
        4
        >>> FlowPolicy().worker_buffer_batches(bytes_bounded=True)
        32
        """
        batches = max(self.requests_in_flight_per_worker, self.batches_per_fetch)
        if bytes_bounded and self.batches_per_fetch > 1:
            batches = max(batches, self.small_reply_batches)
        return batches

    def reorder_window_batches(self, num_workers_per_csx: int) -> Optional[int]:
        """Dynamic assignment: the reorder window's bound in batches for a CS-X's
        ``num_workers_per_csx`` workers; None: :attr:`reorder_window_batches_per_worker` is
        None (the stream sizes the window from its workers' buffers)."""
        per_worker = self.reorder_window_batches_per_worker
        return None if per_worker is None else num_workers_per_csx * per_worker

    def input_bytes_per_worker(self, num_csx: int, num_workers_per_csx: int,
                               object_store_bytes: Optional[int]) -> Optional[int]:
        """One input worker's byte bound: :attr:`input_bytes_in_flight_per_csx` (or, when None,
        :data:`OBJECT_STORE_SHARE_FOR_INPUT` of ``object_store_bytes`` shared by the
        ``num_csx`` CS-Xs) split over a CS-X's workers. None: neither is known. At least one
        byte: each worker always has at least one batch in flight.

        >>> FlowPolicy().input_bytes_per_worker(2, 4, 8 * 2**30) // 2**20  # MiB
        256
        >>> FlowPolicy(input_bytes_in_flight_per_csx=2**20).input_bytes_per_worker(1, 1, None)
        1048576
        """
        per_csx = self.input_bytes_in_flight_per_csx
        if per_csx is None:
            if not object_store_bytes:
                return None
            per_csx = int(object_store_bytes * OBJECT_STORE_SHARE_FOR_INPUT) // num_csx
        return max(1, per_csx // num_workers_per_csx)

    @property
    def ack_every_steps(self) -> int:
        """How often the client tells the wafer how far it is when it has nothing to fetch."""
        return max(1, self.lookahead_steps // 2)

    @property
    def collect_more_steps(self) -> int:
        """When the client must wait for a step's outputs, it also waits for up to this many
        steps after it (or ``collect_more_s``, or the end of the run), so a client ahead of the
        wafer makes one call per this many steps rather than one per step. Half the look-ahead:
        the wafer can run that far past the step the client waits for."""
        return max(0, self.lookahead_steps // 2)

    @property
    def collect_more_s(self) -> float:
        """The most time a collect waits for those further steps once the step it needs is
        done: closures lag the wafer by at most this much more. Each call wakes threads in
        the client and the driver, which on a machine whose cores the step's threads fill
        delays the step: on 2 cores a 10 ms step ran 10-15% slower with one call every 2 steps
        than with one every 9. The closures of one call then run back to back; ``rate()`` read
        in them is timed by the wafer's step ends, not by the client's clock
        (:class:`executor.profiler.Profiler`)."""
        return 0.1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def object_store_bytes_for(total_memory_bytes: int) -> int:
    """The embedded object store's size: 30% of the machine's memory (Ray's own default share),
    at least 512 MiB."""
    return max(512 * 1024 * 1024, int(total_memory_bytes * 0.3))


OBJECT_STORE_SHARE_FOR_INPUT = 0.25
"""The share of the object store the input side may fill by default: the rest holds the wafer's
input buffers (whose batches still live in the objects that carried them), step outputs and
whatever else the cluster runs."""
