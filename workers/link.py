"""One input worker as its stream sees it: a :class:`WorkerLink` owns the worker's Ray actor,
its ``fetch`` requests in flight, the replies received and not yet handed out, and where it
runs; its restarts and straggler reports go to the stream's
:class:`~workers.supervision.Supervisor`.

A reply travels one way: the actor's ``fetch`` (:mod:`workers.input_worker`) -> :meth:`WorkerLink.receive`
(waits, decodes it into :class:`~workers.replies.WorkerReply` items, queues them in
:attr:`WorkerLink.ready`) -> the stream's assignment, which takes them (:meth:`WorkerLink.take`)
in global-batch order.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray

from workers import ray_compat
from workers.config import CSConfig
from workers.context import WorkerInfo
from workers.flow import FlowPolicy
from workers.input_worker import InputWorker
from workers.placement import NodePlacer
from workers.replies import ReplyKind, WorkerReply, replies_of
from workers.positions import WorkerPosition

__all__ = ["DEFAULT_NAME_PREFIX", "LinkSetup", "WorkerFailed", "WorkerLink", "kill_named_workers",
           "kill_workers", "start_workers_ahead"]

NUM_CPUS = 0.01
_NAME_RELEASE_S = 5.0  # a name freed by close() or ray.kill is released within moments
_MIN_BATCHES_FOR_LOW_WATER = 16
"""Replies of at least this many batches are asked for at a low-water mark (see ``request``)."""

DEFAULT_NAME_PREFIX = "cstream"


def worker_name(name_prefix: str, wse_id: int, w: int, restart: int = 0,
                generation: int = 0) -> str:
    """The actor name of a worker's process; a restarted one's names its restart (the dead
    one's name stays taken until Ray declares it dead, which takes seconds when its node
    died), and one of a stream whose workers were re-formed (a change of their number under
    round-robin) the re-forming."""
    return f"{name_prefix}-csx{wse_id}-w{w}" + (f"-g{generation}" if generation else "") + \
        (f"-r{restart}" if restart else "")


def _actor_options(name: str, node: dict | None = None) -> dict:
    """A worker's actor options: placed on ``node`` (:class:`~workers.placement.NodePlacer`),
    or spread by Ray where it is None."""
    return dict(name=name, num_cpus=NUM_CPUS, max_concurrency=2, **NodePlacer.options(node))


def start_workers_ahead(cs_config: CSConfig, name_prefix: str = DEFAULT_NAME_PREFIX) -> list:
    """Start every CS-X's input-worker processes now, ahead of the streams that use them.

    A worker's process imports torch and the worker's code for a second or more; started
    here, that overlaps whatever runs before the streams are built (on the CSX backend: the
    wafer driver's own start). Returns ``[wse_id][local_worker_id]`` -> an
    :class:`~workers.input_worker.InputWorker` created with no arguments, or None where the
    actor's name is still taken (by a stream that is closing; that worker is started by its
    stream). Pass CS-X ``c``'s list as ``workers_ahead`` to its
    :class:`~workers.stream.CsxInputStream`, which sets the workers up and takes them (their
    entries become None); kill what is left with :func:`kill_workers`. The workers are spread
    round-robin over the cluster's live nodes (:meth:`workers.placement.NodePlacer.initial`),
    as the streams would place them.
    """
    W = cs_config.num_workers_per_csx
    nodes = NodePlacer(NUM_CPUS).initial(cs_config.num_csx * W)
    ahead = []
    for c in range(cs_config.num_csx):
        row = []
        for w in range(W):
            try:
                row.append(InputWorker.options(
                    **_actor_options(worker_name(name_prefix, c, w), nodes[c * W + w])).remote())
            except ValueError as e:
                if not ray_compat.name_taken(e):
                    raise
                row.append(None)
        ahead.append(row)
    return ahead


def kill_workers(ahead: list) -> None:
    """Kill the workers of :func:`start_workers_ahead` that no stream took."""
    for row in ahead or []:
        for actor in row:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)


def kill_named_workers(cs_config: CSConfig, name_prefix: str = DEFAULT_NAME_PREFIX) -> list:
    """Kill every input worker of ``cs_config``'s CS-Xs that Ray still knows by name: those
    started ahead and any replacement a stream started (a stream whose process died cannot
    close them itself). Returns their names."""
    killed = []
    stems = tuple(f"{name_prefix}-csx{c}-w" for c in range(cs_config.num_csx))
    # workers added to a running stream, and re-formed ones, are named past the config's
    for name in sorted(n for n in ray.util.list_named_actors() if n.startswith(stems)):
        try:
            actor = ray.get_actor(name)
        except ValueError:  # gone already, or never started
            continue
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
            killed.append(name)
    return killed


def first_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")


class WorkerFailed(Exception):
    """A worker's failure (``input_fn`` raised, its actor could not start, a broken
    invariant in transport): the stream closes and raises it as the input error."""

    def __init__(self, link: WorkerLink, reply: WorkerReply):
        super().__init__(reply.error["exc_message"])
        self.link, self.reply = link, reply


@dataclass
class LinkSetup:
    """What every worker of one stream is started with and asked under: the recipe, the
    flow policy's figures for this stream, and the spawn options of its assignment."""

    dataloader_ref: Any
    wse_id: int
    name_prefix: str
    policy: FlowPolicy
    capacity: int  # batches a worker buffers
    in_flight_bytes_per_worker: Optional[int]
    in_flight_per_worker: int  # fetch requests outstanding when each reply carries one batch
    batches_per_fetch: int  # raised where batches are small
    zero_copy: bool
    spawn_options: Callable[[bool], dict]  # one of the first processes -> more InputWorker args

    def fit_reply(self, nbytes: int) -> None:
        """Small batches: as many per reply as a worker may hold."""
        if self.capacity > self.batches_per_fetch:
            m = min(self.capacity, self.policy.batches_per_reply(nbytes))
            self.batches_per_fetch = max(self.batches_per_fetch, m)


@dataclass(eq=False)
class WorkerLink:
    """One input worker of a stream: its actor, the requests and replies in transport, and
    what it delivered."""

    info: WorkerInfo
    name: str
    setup: LinkSetup
    actor: Any = None
    pending: deque = field(default_factory=deque)  # (index, ObjectRef) in request order
    ready: deque = field(default_factory=deque)  # WorkerReply items received, not handed out
    next_request: int = 0
    received: int = 0  # batches received from the worker (resume point after a crash)
    received_after: WorkerPosition = field(default_factory=WorkerPosition)
    consumed: int = 0  # batches handed out by the stream
    consumed_after: WorkerPosition = field(default_factory=WorkerPosition)
    delivered_this_run: int = 0
    bytes: int = 0
    ready_bytes: int = 0  # bytes of the batches in ``ready``
    restarts: int = 0
    straggler_reports: int = 0
    replies: int = 0  # fetch replies received (each one Ray call and one object)
    reported_drawn_ahead: int = 0  # the most batches drawn ahead a need_numbers reply said
    keys_until: int = 0  # batches below this index carry sample keys
    keys: list = field(default_factory=list)  # the sample keys received, in order
    node: dict | None = None  # where the actor was placed, then where it says it runs
    where_ref: Any = None  # the actor's answer to where(), until it is read
    generation: int = 0  # the stream's workers were re-formed this many times before it started
    retired: bool = False  # let go of by its stream while the stream runs: it takes no part
    added: bool = False  # joined the stream while it ran
    @property
    def w(self) -> int:
        return self.info.local_worker_id

    def start_at(self, after: WorkerPosition) -> None:
        """The worker resumes at ``after``, after ``after.worker_step`` of its batches."""
        self.received_after = self.consumed_after = after
        self.received = self.consumed = self.next_request = after.worker_step

    def resume_at(self, after: WorkerPosition) -> None:
        """Dynamic assignment from a saved global position: a restart before any batch, and
        the resume states before any delivery, start at ``after``."""
        self.received_after = self.consumed_after = after

    # -- the actor ------------------------------------------------------------------------
    def spawn(self, ahead=None) -> None:
        """Start the actor on the node :attr:`node`, or set up ``ahead`` (a worker of
        :func:`start_workers_ahead`) as it; :attr:`where_ref` asks the actor where it runs."""
        s = self.setup
        args = (s.dataloader_ref, self.info, self.received_after, s.capacity)
        kwargs = dict(capacity_bytes=s.in_flight_bytes_per_worker, keys_until=self.keys_until,
                      owns_global_rng=True,
                      **s.spawn_options(self.restarts == 0 and self.generation == 0
                                       and not self.added))
        if ahead is not None:
            try:
                ray.get(ahead.setup.remote(*args, **kwargs))
                self.actor, self.where_ref = ahead, ahead.where.remote()
                return
            except BaseException as e:
                with contextlib.suppress(Exception):
                    ray.kill(ahead, no_restart=True)
                if not isinstance(e, ray.exceptions.RayError):
                    raise
                # a new actor's constructor meets the same failure and reports it as usual
        deadline = time.perf_counter() + _NAME_RELEASE_S
        while True:
            try:
                self.actor = InputWorker.options(**_actor_options(self.name, self.node)).remote(
                    *args, **kwargs)
                self.where_ref = self.actor.where.remote()
                return
            except ValueError as e:
                if not ray_compat.name_taken(e):
                    raise
                if time.perf_counter() >= deadline:
                    raise ValueError(
                        f"CsxInputStream: a Ray actor named {self.name!r} already exists, so the "
                        f"input worker {self.w} of CS-X {s.wse_id} cannot be started. Another "
                        f"input stream with name_prefix={s.name_prefix!r} is still open for this "
                        "CS-X: close() it first, or give this stream another name_prefix."
                    ) from None
                time.sleep(0.1)

    def respawn(self, node: dict | None) -> None:
        """A new process on ``node`` for a worker whose process died, from the position after
        the last batch received from it."""
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)  # it may be gone already
        self.pending.clear()
        self.next_request = self.received
        self.node = node
        self.name = worker_name(self.setup.name_prefix, self.setup.wse_id, self.w, self.restarts,
                                self.generation)
        self.spawn()

    def node_of(self, wait_s: float) -> dict | None:
        """Where the actor runs: its answer to ``where()`` (waited for up to ``wait_s``), else
        the node it was placed on (an actor that died before answering)."""
        if self.where_ref is not None:
            try:
                self.node = ray.get(self.where_ref, timeout=wait_s)
                self.where_ref = None
            except ray.exceptions.GetTimeoutError:
                pass
            except ray.exceptions.RayError:
                self.where_ref = None  # it died before answering: where it was placed
        return self.node

    def kill(self) -> None:
        self.pending.clear()
        self.ready.clear()
        if self.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            self.actor = None

    # -- requests -------------------------------------------------------------------------
    def request(self, assign: tuple | None = None, min_batches: int = 1) -> bool:
        """Ask for more batches where the requests in flight and the byte budget allow.
        ``assign``: numbers for the worker (:meth:`InputWorker.assign` arguments) that the
        first request made carries; returns whether one did. ``min_batches``: the batches a
        multi-batch reply waits for (an assignment that gives numbers says how many; 1: never
        more than its first)."""
        extra = {} if assign is None else {"assign": assign}
        s = self.setup
        m = s.batches_per_fetch
        budget = s.in_flight_bytes_per_worker
        if m > 1:
            # a reply holds as many ready batches as there are (up to m), so the next request's
            # first batch is known only when it arrives: one request at a time. Bounded in
            # bytes: the reply may bring what the batches waiting here leave of the budget.
            # many small batches per reply: ask again only once the batches waiting here are
            # down to a quarter of a reply, so that the worker's buffer fills in between and
            # the next reply brings a full one (asking at once would bring what the worker
            # made since the last reply, one batch or two)
            low_water = m // 4 if m >= _MIN_BATCHES_FOR_LOW_WATER else m
            if not self.pending and len(self.ready) <= low_water:
                max_bytes = None if budget is None else max(0, budget - self.ready_bytes)
                if max_bytes == 0 and self.ready:
                    return False  # asked again once the stream has taken batches
                self.pending.append((self.next_request, self.actor.fetch.remote(
                    self.next_request, m, max_bytes,
                    min_batches, **extra)))
                return bool(extra)
            return False
        if budget is not None and self.ready and self.ready_bytes >= budget:
            return False
        carried = False
        while len(self.pending) < s.in_flight_per_worker:
            self.pending.append((self.next_request, self.actor.fetch.remote(
                self.next_request, **({} if carried else extra))))
            self.next_request += 1
            carried = bool(extra)
        return carried

    def send_numbers(self, send: int, numbers: list, min_batches: int) -> None:
        """Dynamic assignment: global batch numbers for the worker, carried by a new request
        where none is out (one call, not two); ``min_batches`` as for :meth:`request`."""
        if self.pending or not self.request(assign=(send, numbers), min_batches=min_batches):
            self.actor.assign.remote(send, numbers)

    # -- replies --------------------------------------------------------------------------
    def receive(self, supervisor, numbered: bool = False) -> bool:
        """Wait for the oldest outstanding reply and queue its items in :attr:`ready`; False
        when there is none to wait for (the batches waiting here fill the byte bound) or when
        the worker was restarted and the assignment does not wait for its new process.

        ``numbered``: the assignment gives this worker its numbers (dynamic assignment) and
        asks again itself after each reply, with the ``min_batches`` it computes; a
        ``need_numbers`` reply is then kept in :attr:`reported_drawn_ahead` for it to read.
        Otherwise the link asks again at once, for replies that wait for their first batch."""
        if not numbered:
            self.request()
        if not self.pending:
            return False
        got = supervisor.await_reply(self)
        if got is None:
            return False
        index, wire = got
        self.pending.popleft()
        self.replies += 1
        if self.where_ref is not None:
            self.node_of(0)  # it answered a fetch: where() is answered too, as a rule
        items = replies_of(wire, copy=not self.setup.zero_copy)
        if items[0].kind is ReplyKind.NEED_NUMBERS:
            if not numbered:  # a broken invariant, never a silent wait
                raise WorkerFailed(self, WorkerReply.failure(
                    "RuntimeError", "a worker not given numbers asked for more "
                    f"({items[0].drawn_ahead} drawn ahead)", "in transport"))
            # the worker's loader draws more batches ahead than it was granted numbers for;
            # ask for batch ``index`` again once it has more
            self.reported_drawn_ahead = max(self.reported_drawn_ahead, int(items[0].drawn_ahead))
            if self.setup.batches_per_fetch == 1:
                self.pending.appendleft((index, self.actor.fetch.remote(index)))
            return True
        self._queue(index, items)
        if self.setup.batches_per_fetch > 1:
            self.next_request = self.received
        if not numbered:
            self.request()
        return True

    def _queue(self, index: int, items: list[WorkerReply]) -> None:
        """Queue the items of the reply to the request for batch ``index`` (up to and with an
        error item), and note what they bring."""
        received_unix = time.time()
        if not items[0].failed:
            self.setup.fit_reply(items[0].nbytes)
        for i, item in enumerate(items):
            item.received_unix = received_unix
            # a broken invariant, never silently wrong data
            if item.index != index + i and not item.failed:  # pragma: no cover
                raise WorkerFailed(self, WorkerReply.failure(
                    "RuntimeError", f"asked for batch {index + i}, received batch {item.index}",
                    "in transport"))
            self.ready.append(item)
            if item.failed:
                break
            self.ready_bytes += item.nbytes
            if item.keys is not None:
                self.keys.append(item.keys)
            self.received = index + i + 1
            self.received_after = item.after

    def received_waiting(self) -> int:
        """Batches received and not yet taken (an error item is no batch)."""
        return sum(1 for it in self.ready if not it.failed)

    def failed_here(self) -> bool:
        """Whether the worker's error reply is the last thing received."""
        return bool(self.ready) and self.ready[-1].failed

    def take(self) -> WorkerReply:
        """The oldest item received (there must be one): a batch, or the worker's failure."""
        item = self.ready.popleft()
        if not item.failed:
            self.ready_bytes -= item.nbytes
        return item

    def delivered(self, item: WorkerReply) -> None:
        """``item`` was handed out by the stream."""
        self.consumed = item.index + 1
        self.consumed_after = item.after
        self.delivered_this_run += 1
        self.bytes += item.nbytes
