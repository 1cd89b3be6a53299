"""The input side of one CS-X on Ray: its :class:`~workers.input_worker.InputWorker` actors and
the merge of their batches into the CS-X's sequence of global batches.

Which worker produces which global batch is the stream's :class:`Assignment`: with
:class:`RoundRobin` (the default, static assignment) step ``s`` of a CS-X comes from its local
worker ``s % num_workers_per_csx``; :class:`workers.coordinator.Coordinator` assigns them
dynamically. Each worker keeps a
few ``fetch`` requests outstanding so that transport overlaps production, and never runs more
than a bounded number of batches ahead of the consumer. A worker whose process dies is restarted
from the position right after the last batch received from it, so no batch is lost or
duplicated; an exception from ``input_fn`` stops the stream with :class:`InputWorkerError`.
Workers are spread round-robin over the cluster's live nodes, and a restarted one goes to a
live node away from the one it died on (:mod:`workers.placement`); :meth:`CsxInputStream.stats`
says where each runs and records every restart.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray
import torch
from torch.utils._pytree import tree_map_only

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint, WorkerInfo
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.duplicates import WorkerKeys
from workers.errors import InputWorkerError, StragglerWarning, WorkerCrashLoopError
from workers.flow import FlowPolicy
from workers.input_worker import InputWorker, unpack_reply
from workers.local_stream import BatchInfo, sample_key_batches
from workers.placement import NodePlacer
from workers.resume import ExhaustedIteratorError, ResumeError, check_position, start_position

__all__ = ["BatchInfo", "CsxInputStream", "kill_named_workers", "kill_workers",
           "start_workers_ahead"]

logger = logging.getLogger(__name__)

_NUM_CPUS = 0.01
_NAME_RELEASE_S = 5.0  # a name freed by close() or ray.kill is released within moments
_DUMP_STACK_TIMEOUT_S = 5.0
_STOP_JOIN_S = 1.0  # how long close() lets producers finish the batch they are making
_MAX_STRAGGLER_RECORDS = 100
_WHERE_WAIT_S = 2.0  # how long stats() waits for the workers to say where they run


DEFAULT_NAME_PREFIX = "cstream"


def _worker_name(name_prefix: str, wse_id: int, w: int, restart: int = 0) -> str:
    """The actor name of a worker's process; a restarted one's names its restart (the dead
    one's name stays taken until Ray declares it dead, which takes seconds when its node
    died)."""
    return f"{name_prefix}-csx{wse_id}-w{w}" + (f"-r{restart}" if restart else "")


def _name_taken(e: ValueError) -> bool:
    """Whether Ray refused to create a named actor because the name is in use."""
    return "already" in str(e) or "taken" in str(e)


def _actor_options(name: str, node: dict | None = None) -> dict:
    """A worker's actor options: placed on ``node`` (:class:`~workers.placement.NodePlacer`),
    or spread by Ray where it is None."""
    return dict(name=name, num_cpus=_NUM_CPUS, max_concurrency=2, **NodePlacer.options(node))


def start_workers_ahead(cs_config: CSConfig, name_prefix: str = DEFAULT_NAME_PREFIX) -> list:
    """Start every CS-X's input-worker processes now, ahead of the streams that use them.

    A worker's process imports torch and the worker's code for a second or more; started
    here, that overlaps whatever runs before the streams are built (on the CSX backend: the
    wafer driver's own start). Returns ``[wse_id][local_worker_id]`` -> an
    :class:`~workers.input_worker.InputWorker` created with no arguments, or None where the
    actor's name is still taken (by a stream that is closing; that worker is started by its
    stream). Pass CS-X ``c``'s list as ``workers_ahead`` to its :class:`CsxInputStream`, which
    sets the workers up and takes them (their entries become None); kill what is left with
    :func:`kill_workers`. The workers are spread round-robin over the cluster's live nodes
    (:meth:`workers.placement.NodePlacer.initial`), as the streams would place them.
    """
    W = cs_config.num_workers_per_csx
    nodes = NodePlacer(_NUM_CPUS).initial(cs_config.num_csx * W)
    ahead = []
    for c in range(cs_config.num_csx):
        row = []
        for w in range(W):
            try:
                row.append(InputWorker.options(
                    **_actor_options(_worker_name(name_prefix, c, w), nodes[c * W + w])).remote())
            except ValueError as e:
                if not _name_taken(e):
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
    names = {_worker_name(name_prefix, c, w, r) for c in range(cs_config.num_csx)
             for w in range(cs_config.num_workers_per_csx)
             for r in range(cs_config.max_worker_restarts + 1)}
    for name in sorted(names.intersection(ray.util.list_named_actors())):
        try:
            actor = ray.get_actor(name)
        except ValueError:  # gone already, or never started
            continue
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
            killed.append(name)
    return killed


_MIN_BATCHES_FOR_LOW_WATER = 16
"""Replies of at least this many batches are asked for at a low-water mark (see ``top_up``)."""


@dataclass
class StreamWorker:
    """One input worker as its stream sees it: its actor, the requests and replies in
    transport, and what it delivered."""

    info: WorkerInfo
    name: str
    actor: Any = None
    pending: deque = field(default_factory=deque)  # (index, ObjectRef) in request order
    ready: deque = field(default_factory=deque)  # replies received, not yet handed out
    next_request: int = 0
    received: int = 0  # batches received from the worker (resume point after a crash)
    received_after: dict = field(default_factory=dict)
    consumed: int = 0  # batches handed out by next()
    consumed_after: dict = field(default_factory=dict)
    delivered_this_run: int = 0
    bytes: int = 0
    ready_bytes: int = 0  # bytes of the batches in ``ready``
    restarts: int = 0
    straggler_reports: int = 0
    replies: int = 0  # fetch replies received (each one Ray call and one object)
    keys_until: int = 0  # batches below this index carry sample keys
    keys: list = field(default_factory=list)  # the sample keys received, in order
    node: dict | None = None  # where the actor was placed, then where it says it runs
    where_ref: Any = None  # the actor's answer to where(), until it is read


def _position_of(state: DataLoaderCheckpoint, wse_id: int) -> dict:
    """The ``after`` dict (as carried in replies) described by a saved checkpoint."""
    pos = check_position(dict(state.user_state_dict or start_position()),
                         f"the resume state of CS-X {wse_id}, worker {state.local_worker_id}")
    return {"worker_step": int(state.worker_step), "samples_streamed": int(state.samples_streamed),
            "user_state_dict": pos}


def _start_of(after: dict) -> dict:
    return {"worker_step": after.get("worker_step", 0),
            "samples_streamed": after.get("samples_streamed", 0),
            "position": after.get("user_state_dict") or start_position()}


_OWN_ERRORS = {cls.__name__: cls for cls in (EmptyDataLoaderError, ExhaustedIteratorError,
                                             ResumeError)}


def input_error(wse_id: int, local_worker_id: int, num_workers: int, reply: dict,
                global_batch: int | None = None) -> Exception:
    """The exception for a worker's error reply: the input side's own errors (an empty or
    used-up loader, a position that cannot be resumed) as themselves, naming the worker;
    anything ``input_fn`` raised as :class:`InputWorkerError`, naming the global batch
    (``global_batch``, 0-based: the step is one more) the failed batch was for, where the
    stream knows it."""
    own = _OWN_ERRORS.get(reply.get("exc_type")) if reply.get("exc_module", "").startswith(
        "workers.") else None
    if own is not None:
        return own(f"CS-X {wse_id}, input worker {local_worker_id}: {reply['exc_message']}")
    return InputWorkerError(wse_id, local_worker_id, reply["exc_type"], reply["exc_message"],
                            reply.get("traceback", ""), reply.get("during", ""), num_workers,
                            reply.get("index"), global_batch)


def local_object_store_bytes() -> int | None:
    """The size of this node's Ray object store (where the batches of this stream arrive)."""
    node = ray.get_runtime_context().get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node:
            return int(n.get("Resources", {}).get("object_store_memory", 0)) or None
    return None


def _node_label(node: dict | None) -> str:
    """``"<node id, 12 hex digits> (<ip>)"``, or ``"unknown"``."""
    if not node:
        return "unknown"
    return f"{node['node_id'][:12]} ({node.get('node_ip') or '?'})"


def _where_fields(node: dict | None) -> dict:
    """A worker's node for its stats: ``node_id``, ``node_ip`` and ``pid`` (None if unknown)."""
    node = node or {}
    return {"node_id": node.get("node_id"), "node_ip": node.get("node_ip"),
            "pid": node.get("pid")}


def _first_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")


def _check_arguments(dataloader, cs_config, wse_id, policy, name_prefix) -> None:
    """Refuse :class:`CsxInputStream` arguments of the wrong kind, saying how to build them."""
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"CsxInputStream: dataloader must be a cstream DataLoader "
            f"(cstream.utils.data.DataLoader(input_fn, ...)), got "
            f"{type(dataloader).__name__}: {dataloader!r}."
        )
    if not isinstance(cs_config, CSConfig):
        raise TypeError(
            f"CsxInputStream: cs_config must be a CSConfig, got {type(cs_config).__name__}: "
            f"{cs_config!r}. Build one with cstream.utils.CSConfig(num_csx=..., "
            "num_workers_per_csx=...)."
        )
    if isinstance(wse_id, bool) or not isinstance(wse_id, int) or not (
            0 <= wse_id < cs_config.num_csx):
        raise ValueError(
            f"CsxInputStream: wse_id={wse_id!r} is not a CS-X of this cluster; it must be an "
            f"int in [0, {cs_config.num_csx}) (cs_config.num_csx={cs_config.num_csx})."
        )
    if not isinstance(policy, FlowPolicy):
        raise TypeError(
            f"CsxInputStream: policy must be a FlowPolicy, got {type(policy).__name__}: "
            f"{policy!r}. Build the run's with workers.flow.FlowPolicy.from_config(cs_config)."
        )
    if not isinstance(name_prefix, str) or not name_prefix:
        raise ValueError(
            f"CsxInputStream: name_prefix={name_prefix!r}; it must be a non-empty string "
            "(actors are named '<name_prefix>-csx<c>-w<w>')."
        )
    if not ray.is_initialized():
        raise RuntimeError(
            "CsxInputStream starts its input workers as Ray actors, and Ray is not "
            "initialised in this process. Start it first (ray.init(...), or create "
            "cstream.backend(\"CSX\"), which starts or joins Ray), or use "
            "workers.local_stream.LocalInputStream to stream without Ray."
        )


class CsxInputStream:
    """The input side of one CS-X: its InputWorker actors and the merge of their batches, in
    the order its ``assignment`` gives (:class:`RoundRobin` unless another is given).

    Args:
        dataloader: the :class:`workers.dataloader.DataLoader` recipe every worker runs.
        cs_config: the cluster layout (``num_workers_per_csx``, ``max_worker_restarts``,
            ``straggler_timeout_s``).
        wse_id: which CS-X this stream feeds (``0 <= wse_id < cs_config.num_csx``).
        resume_states: the :meth:`worker_states` of an earlier stream of this CS-X; the new
            stream delivers exactly the batches that stream would have delivered next.
        policy: the run's :class:`~workers.flow.FlowPolicy`: the ``fetch`` requests kept
            outstanding per worker when each reply carries one batch
            (``requests_in_flight_per_worker``), the most batches per reply
            (``batches_per_fetch``: one Ray call and one object for all the batches a worker
            has ready, one request outstanding at a time; replies of small batches carry up to
            ``policy.batches_per_reply(nbytes)`` of them where a byte bound is in force), and
            each worker's byte bound. A worker buffers up to
            ``policy.worker_buffer_batches(...)`` produced batches, so it is never more than
            :attr:`max_batches_ahead` batches ahead of :meth:`next`.
        name_prefix: actors are named ``f"{name_prefix}-csx{wse_id}-w{w}"``.
        workers_ahead: this CS-X's row of :func:`start_workers_ahead` (entries may be None):
            those workers are set up and used instead of starting new ones; each one taken
            becomes None in the list. One whose set-up fails is killed and a new worker
            started in its place, so that a failure shows as it does without.
        zero_copy: True when the caller is each batch's only reader: batches are handed out
            without a defensive copy.
        assignment: which worker produces which global batch (an :class:`Assignment`);
            None: :class:`RoundRobin`.

    The parts an assignment works with are public: :attr:`workers` (one
    :class:`StreamWorker` per local worker), :attr:`step` (the global batch :meth:`next`
    delivers next), :meth:`top_up` and :meth:`receive_reply` (ask a worker for batches, take
    its next reply), :meth:`raise_failure`, :meth:`report_straggler`, :meth:`with_stacks`,
    :meth:`node_of`, :attr:`placer` and :meth:`check_open`.

    Each worker's batches in flight -- produced and buffered in the worker, in replies on their
    way, received here and not yet handed out by :meth:`next` -- are bounded in bytes too, by
    :meth:`workers.flow.FlowPolicy.input_bytes_per_worker` (``CSConfig.input_bytes_in_flight_per_csx``
    or a share of this node's object store); at least one batch is always in flight.

    >>> import torch, ray
    >>> from workers import CSConfig
    >>> from workers.dataloader import DataLoader
    >>> def input_fn():
    ...     from workers import get_worker_info
    ...     w = get_worker_info().local_worker_id
    ...     return [{"x": torch.full((2,), 10 * w + i)} for i in range(3)]
    >>> from workers.flow import FlowPolicy
    >>> cfg = CSConfig(num_workers_per_csx=2)
    >>> s = CsxInputStream(DataLoader(input_fn), cfg, 0, policy=FlowPolicy.from_config(cfg),
    ...                    name_prefix="doctest")  # doctest: +SKIP
    >>> [s.next()[0]["x"][0].item() for _ in range(4)]  # doctest: +SKIP
    [0, 10, 1, 11]
    >>> s.close()  # doctest: +SKIP
    """

    def __init__(self, dataloader, cs_config, wse_id, *, policy: FlowPolicy,
                 resume_states=None, name_prefix=DEFAULT_NAME_PREFIX, zero_copy=False,
                 workers_ahead: list | None = None, assignment: Assignment | None = None):
        _check_arguments(dataloader, cs_config, wse_id, policy, name_prefix)
        self.zero_copy = bool(zero_copy)  # True: the caller is each batch's only reader
        self.dataloader = dataloader
        self.cs_config = cs_config
        self.wse_id = wse_id
        self.policy = policy
        self.name_prefix = name_prefix
        W = self.num_workers = cs_config.num_workers_per_csx
        self.in_flight_per_worker = policy.requests_in_flight_per_worker
        self.batches_per_fetch = policy.batches_per_fetch  # raised where batches are small
        self.in_flight_bytes_per_worker = policy.input_bytes_per_worker(
            cs_config.num_csx, W, None if policy.input_bytes_in_flight_per_csx else
            local_object_store_bytes())
        self.capacity = policy.worker_buffer_batches(
            bytes_bounded=self.in_flight_bytes_per_worker is not None)
        self.closed = False
        self.peeked = None
        self.step = 0
        self._wait_s = 0.0
        self._stragglers: list[dict] = []
        self._restart_events: list[dict] = []
        self.placer = NodePlacer(_NUM_CPUS)
        self.key_batches = sample_key_batches(cs_config)
        self.poll_s = min(0.25, cs_config.straggler_timeout_s / 4)
        self.workers = [StreamWorker(info=WorkerInfo(w, W, cs_config.num_csx, wse_id),
                                     name=_worker_name(name_prefix, wse_id, w))
                        for w in range(W)]
        for wk in self.workers:
            wk.received_after = wk.consumed_after = {
                "worker_step": 0, "samples_streamed": 0,
                "user_state_dict": {"epoch": 0, "batch_in_epoch": 0}}
        if resume_states is not None:
            self._apply_resume(list(resume_states))
        self.first_step = self.step  # global batch number of this run's first step
        self._slowest_s: float | None = None  # the slowest batch delivered (its produce_s)
        for wk in self.workers:
            wk.keys_until = wk.received + self.key_batches
        self._dataloader_ref = ray.put(dataloader)
        self._t_start = time.perf_counter()
        self._t_first: float | None = None
        self.assignment = RoundRobin() if assignment is None else assignment
        self.assignment.attach(self)
        try:
            self._start_workers([] if workers_ahead is None else workers_ahead)
            self.assignment.begin()
        except BaseException:
            self.close()
            raise

    # -- setup ----------------------------------------------------------------------------
    def _apply_resume(self, states: list) -> None:
        W = self.num_workers
        parsed = []
        for st in states:
            if isinstance(st, dict):
                st = DataLoaderCheckpoint(**st)
            if not isinstance(st, DataLoaderCheckpoint):
                raise TypeError(
                    f"CsxInputStream: resume_states must hold DataLoaderCheckpoint objects (from "
                    f"worker_states()), got {type(st).__name__}: {st!r}."
                )
            parsed.append(st)
        ids = sorted(st.local_worker_id for st in parsed)
        if ids != list(range(W)):
            raise ValueError(
                f"CsxInputStream: resume_states for CS-X {self.wse_id} must hold one state per "
                f"worker 0..{W - 1} (num_workers_per_csx={W}), got states for local_worker_ids "
                f"{ids}. Resume with the same CSConfig.num_workers_per_csx the states were saved "
                "with."
            )
        for st in parsed:
            if st.num_workers_per_csx != W or st.wse_id != self.wse_id:
                raise ValueError(
                    f"CsxInputStream: a resume state was saved by CS-X {st.wse_id} with "
                    f"num_workers_per_csx={st.num_workers_per_csx}, but this stream is CS-X "
                    f"{self.wse_id} with num_workers_per_csx={W}. Pass each CS-X the states its "
                    "own workers saved, with the same CSConfig."
                )
            if st.worker_step < 0:
                raise ValueError(
                    f"CsxInputStream: resume state of worker {st.local_worker_id} has "
                    f"worker_step={st.worker_step}; it must be >= 0."
                )
        steps = [0] * W
        for st in parsed:
            steps[st.local_worker_id] = int(st.worker_step)
        total = sum(steps)
        expected = [(total - w + W - 1) // W for w in range(W)]
        if steps != expected:
            raise ValueError(
                f"CsxInputStream: the resume states' worker_step values {steps} are not one "
                f"round-robin position of CS-X {self.wse_id} (after {total} steps they would be "
                f"{expected}). Pass the states from one worker_states() call of one stream."
            )
        for st in parsed:
            wk = self.workers[st.local_worker_id]
            after = _position_of(st, self.wse_id)
            wk.received_after = wk.consumed_after = after
            wk.received = wk.consumed = wk.next_request = int(st.worker_step)
        self.step = total

    def _start_workers(self, ahead: list) -> None:
        """Start every worker (taking those of ``ahead``, :func:`start_workers_ahead`'s row
        for this CS-X) and send each its first requests."""
        nodes = self.placer.initial(self.num_workers, first=self.wse_id * self.num_workers)
        for wk in self.workers:  # placed as start_workers_ahead places them
            w = wk.info.local_worker_id
            wk.node = nodes[w]
            actor = ahead[w] if w < len(ahead) else None
            if actor is not None:
                ahead[w] = None  # taken: set up, or killed if that fails
            wk.actor = self._spawn(wk, ahead=actor)
            self.assignment.started(wk, wk.actor)
        for wk in self.workers:
            self.top_up(wk)

    def _spawn(self, wk: StreamWorker, ahead=None):
        """Start ``wk``'s actor on the node ``wk.node``, or set up ``ahead`` (a worker of
        :func:`start_workers_ahead`) as it; ``wk.where_ref`` asks the actor where it runs."""
        args = (self._dataloader_ref, wk.info, _start_of(wk.received_after), self.capacity)
        kwargs = dict(capacity_bytes=self.in_flight_bytes_per_worker, keys_until=wk.keys_until,
                      owns_global_rng=True,
                      **self.assignment.spawn_options(wk))
        if ahead is not None:
            try:
                ray.get(ahead.setup.remote(*args, **kwargs))
                wk.where_ref = ahead.where.remote()
                return ahead
            except BaseException as e:
                with contextlib.suppress(Exception):
                    ray.kill(ahead, no_restart=True)
                if not isinstance(e, ray.exceptions.RayError):
                    raise
                # a new actor's constructor meets the same failure and reports it as usual
        deadline = time.perf_counter() + _NAME_RELEASE_S
        while True:
            try:
                actor = InputWorker.options(**_actor_options(wk.name, wk.node)).remote(
                    *args, **kwargs)
                wk.where_ref = actor.where.remote()
                return actor
            except ValueError as e:
                if not _name_taken(e):
                    raise
                if time.perf_counter() >= deadline:
                    raise ValueError(
                        f"CsxInputStream: a Ray actor named {wk.name!r} already exists, so the "
                        f"input worker {wk.info.local_worker_id} of CS-X {self.wse_id} cannot be "
                        f"started. Another input stream with name_prefix={self.name_prefix!r} is "
                        "still open for this CS-X: close() it first, or give this stream another "
                        "name_prefix."
                    ) from None
                time.sleep(0.1)

    def top_up(self, wk: StreamWorker, assign: tuple | None = None) -> bool:
        """Ask ``wk`` for more batches where its requests and the budget allow. ``assign``:
        numbers for the worker (:meth:`InputWorker.assign` arguments) that the first request
        made carries; returns whether one did."""
        extra = {} if assign is None else {"assign": assign}
        m = self.batches_per_fetch
        budget = self.in_flight_bytes_per_worker
        if m > 1:
            # a reply holds as many ready batches as there are (up to m), so the next request's
            # first batch is known only when it arrives: one request at a time. Bounded in
            # bytes: the reply may bring what the batches waiting here leave of the budget.
            # many small batches per reply: ask again only once the batches waiting here are
            # down to a quarter of a reply, so that the worker's buffer fills in between and
            # the next reply brings a full one (asking at once would bring what the worker
            # made since the last reply, one batch or two)
            low_water = m // 4 if m >= _MIN_BATCHES_FOR_LOW_WATER else m
            if not wk.pending and len(wk.ready) <= low_water:
                max_bytes = None if budget is None else max(0, budget - wk.ready_bytes)
                if max_bytes == 0 and wk.ready:
                    return False  # asked again once next() has taken batches
                wk.pending.append((wk.next_request, wk.actor.fetch.remote(
                    wk.next_request, m, max_bytes, self.assignment.reply_min_batches(wk), **extra)))
                return bool(extra)
            return False
        if budget is not None and wk.ready and wk.ready_bytes >= budget:
            return False
        carried = False
        while len(wk.pending) < self.in_flight_per_worker:
            wk.pending.append((wk.next_request, wk.actor.fetch.remote(
                wk.next_request, **({} if carried else extra))))
            wk.next_request += 1
            carried = bool(extra)
        return carried

    # -- receiving ------------------------------------------------------------------------
    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError(
                f"the input stream of CS-X {self.wse_id} is closed; create a new CsxInputStream "
                "(with resume_states=old.worker_states() to continue where it stopped)."
            )

    def _receive(self, w: int) -> tuple[dict, Any]:
        wk = self.workers[w]
        if not wk.ready:
            self.receive_reply(wk)
        reply = wk.ready.popleft()
        if reply["kind"] == "error":
            self.raise_failure(wk, reply)
        wk.ready_bytes -= reply["nbytes"]
        if not wk.pending:
            self.top_up(wk)
        return reply, reply.pop("batch")

    def receive_reply(self, wk: StreamWorker) -> bool:
        """Wait for ``wk``'s oldest outstanding reply and queue its batches in ``wk.ready``;
        False when there is none to wait for (the batches waiting here fill the byte bound)
        or when ``wk`` was restarted and the assignment does not wait for its new process."""
        self.top_up(wk)
        if not wk.pending:
            return False
        got = self._await_reply(wk)
        if got is None:
            return False
        index, reply = got
        wk.pending.popleft()
        wk.replies += 1
        if wk.where_ref is not None:
            self.node_of(wk, 0)  # it answered a fetch: where() is answered too, as a rule
        if reply["kind"] == "need_numbers":
            # dynamic assignment: the worker's loader draws more batches ahead than it was
            # granted numbers for; ask for batch ``index`` again once it has more
            self.assignment.needs_numbers(wk, reply["drawn_ahead"])
            if self.batches_per_fetch == 1:
                wk.pending.appendleft((index, wk.actor.fetch.remote(index)))
            else:
                self.top_up(wk)
            return True
        self._queue_batches(wk, index, reply)
        if self.batches_per_fetch > 1:
            wk.next_request = wk.received
        self.top_up(wk)
        return True

    def _await_reply(self, wk: StreamWorker) -> tuple[int, dict] | None:
        """``(index, reply)`` of ``wk``'s oldest outstanding request, waited for as long as it
        takes (reporting a straggler every ``straggler_timeout_s`` and more), restarting the
        worker whose process died; None once it was restarted and the assignment does not
        wait for its new process (:meth:`Assignment.waits_after_restart`)."""
        timeout = self.cs_config.straggler_timeout_s
        wait_start = time.perf_counter()
        next_report = timeout
        while True:
            self.check_open()
            index, ref = wk.pending[0]
            try:
                return index, ray.get(ref, timeout=self.poll_s).body
            except ray.exceptions.GetTimeoutError:
                waited = time.perf_counter() - wait_start
                if waited >= next_report:
                    self.report_straggler(wk, waited)
                    next_report = max(2 * next_report, waited + timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                    ray.exceptions.OwnerDiedError) as e:
                self.check_open()
                if getattr(e, "actor_init_failed", False):
                    self.raise_failure(wk, {
                        "exc_type": type(e).__name__, "exc_message": _first_lines(str(e), 2),
                        "traceback": str(e), "during": "while starting its actor",
                        "index": index})
                self._restart(wk, e)
                if not self.assignment.waits_after_restart():
                    return None
                wait_start, next_report = time.perf_counter(), timeout
            except ray.exceptions.RayTaskError as e:
                self.raise_failure(wk, {
                    "exc_type": type(e).__name__, "exc_message": _first_lines(str(e), 2),
                    "traceback": str(e), "during": "in its fetch call", "index": index})

    def _queue_batches(self, wk: StreamWorker, index: int, reply: dict) -> None:
        """Queue the batches of ``wk``'s ``reply`` to the request for batch ``index`` in
        ``wk.ready`` (up to and with an error item), and note what they bring."""
        # this stream is each batch object's only reader: with zero_copy, no defensive copy
        items = unpack_reply(reply, copy=not self.zero_copy)
        received_unix = time.time()
        if self.capacity > self.batches_per_fetch and items[0]["kind"] != "error":
            # small batches: as many per reply as the worker may hold
            m = min(self.capacity, self.policy.batches_per_reply(items[0]["nbytes"]))
            self.batches_per_fetch = max(self.batches_per_fetch, m)
        for i, item in enumerate(items):
            item["received_unix"] = received_unix
            # a broken invariant, never silently wrong data
            if item["index"] != index + i and item["kind"] != "error":  # pragma: no cover
                self.raise_failure(wk, {
                    "exc_type": "RuntimeError",
                    "exc_message": f"asked for batch {index + i}, received batch "
                                   f"{item['index']}",
                    "traceback": "", "during": "in transport"})
            wk.ready.append(item)
            if item["kind"] == "error":
                break
            wk.ready_bytes += item["nbytes"]
            if "keys" in item:
                wk.keys.append(item["keys"])
            wk.received = index + i + 1
            wk.received_after = item["after"]

    def raise_failure(self, wk: StreamWorker, reply: dict):
        self.close()
        raise input_error(self.wse_id, wk.info.local_worker_id, self.num_workers, reply,
                          self.assignment.global_batch(wk, reply))

    def node_of(self, wk: StreamWorker, wait_s: float) -> dict | None:
        """Where ``wk``'s actor runs: its answer to ``where()`` (waited for up to ``wait_s``),
        else the node it was placed on (an actor that died before answering)."""
        if wk.where_ref is not None:
            try:
                wk.node = ray.get(wk.where_ref, timeout=wait_s)
                wk.where_ref = None
            except ray.exceptions.GetTimeoutError:
                pass
            except ray.exceptions.RayError:
                wk.where_ref = None  # it died before answering: where it was placed
        return wk.node

    def _restart(self, wk: StreamWorker, cause: BaseException) -> None:
        """Start a new process for ``wk``, whose process died of ``cause``, from the position
        after the last batch received from it; past ``max_worker_restarts``, stop the stream
        with :class:`WorkerCrashLoopError`."""
        wk.restarts += 1
        w = wk.info.local_worker_id
        cause_text = f"{type(cause).__name__}: {_first_lines(str(cause))}"
        died_on = self.node_of(wk, 0)
        if wk.restarts > self.cs_config.max_worker_restarts:
            self.close()
            raise WorkerCrashLoopError(self.wse_id, w, wk.restarts,
                                       self.cs_config.max_worker_restarts, cause_text)
        # the node it died on may be dying too (Ray lists it alive for a while): the new
        # process goes to a live node with the fewest of this CS-X's workers
        self.placer.suspect(died_on and died_on["node_id"])
        load = collections.Counter(o.node["node_id"] for o in self.workers
                                   if o is not wk and o.node)
        wk.node = self.placer.replacement(load)
        event = {
            "t_unix": time.time(), "wse_id": self.wse_id, "local_worker_id": w,
            "restart": wk.restarts, "step": self.step, "from_batch": wk.received,
            "cause": cause_text.splitlines()[0], "died_on": _node_label(died_on),
            "restarted_on": _node_label(wk.node)}
        self._restart_events.append(event)
        logger.warning(
            "CS-X %d, input worker %d died on node %s (%s); restarting it from batch %d on node "
            "%s (restart %d of at most %d).", self.wse_id, w, _node_label(died_on), cause_text,
            wk.received, _node_label(wk.node), wk.restarts, self.cs_config.max_worker_restarts)
        with contextlib.suppress(Exception):
            ray.kill(wk.actor, no_restart=True)  # it may be gone already
        wk.pending.clear()
        wk.next_request = wk.received
        wk.name = _worker_name(self.name_prefix, self.wse_id, w, wk.restarts)
        wk.actor = self._spawn(wk)
        event.update(self.assignment.started(wk, wk.actor))
        self.top_up(wk)

    def report_straggler(self, wk: StreamWorker, waited: float) -> None:
        try:
            stack = ray.get(wk.actor.dump_stack.remote(), timeout=_DUMP_STACK_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            stack = (f"(the worker did not answer dump_stack within {_DUMP_STACK_TIMEOUT_S:.0f} s; "
                     "its process may be stuck in native code)")
        except ray.exceptions.RayError as e:
            stack = f"(no stack: {type(e).__name__}: {_first_lines(str(e), 2)})"
        wk.straggler_reports += 1
        w = wk.info.local_worker_id
        msg = (
            f"CS-X {self.wse_id}, input worker {w} is a straggler: it has delivered nothing for "
            f"{waited:.1f} s (straggler_timeout_s={self.cs_config.straggler_timeout_s}) while step "
            f"{self.step + 1} (global batch {self.step}) waits for its batch {wk.received}. The "
            f"stream keeps waiting, since that step can only come from worker {w}. Its Python "
            f"stack:\n{stack}"
        )
        record = {"wse_id": self.wse_id, "local_worker_id": w, "waited_s": round(waited, 3),
                  "step": self.step, "worker_step": wk.received, "stack": stack}
        self._stragglers.append(record)
        del self._stragglers[:-_MAX_STRAGGLER_RECORDS]
        warnings.warn(msg, StragglerWarning, stacklevel=4)

    # -- the public interface -------------------------------------------------------------
    def next(self) -> tuple[Any, BatchInfo]:
        """The next batch of this CS-X (global batch :attr:`step`, from the worker the
        assignment gave it to) and its :class:`BatchInfo`."""
        self.check_open()
        t0 = time.perf_counter()
        if self.peeked is not None:
            (w, reply, batch), self.peeked = self.peeked, None
        else:
            w, reply, batch = self.assignment.next_reply()
        now = time.perf_counter()
        wait_s = now - t0
        if self._t_first is None:
            self._t_first = now
        wk = self.workers[w]
        info = BatchInfo(w, wk.consumed, wait_s, reply["nbytes"],
                         produced_unix=reply.get("produced_unix"),
                         received_unix=reply.get("received_unix"),
                         produce_cpu_s=reply.get("produce_cpu_s"))
        cost = reply.get("produce_s")
        if cost is not None and (self._slowest_s is None or cost > self._slowest_s):
            self._slowest_s = cost
        wk.consumed = reply["index"] + 1
        wk.consumed_after = reply["after"]
        wk.delivered_this_run += 1
        wk.bytes += reply["nbytes"]
        self.step += 1
        self._wait_s += wait_s
        return batch, info

    # -- stalls (workers.stall) ----------------------------------------------------------
    def slowest_batch_s(self) -> float | None:
        """The longest a worker took to produce a batch this stream delivered (None: none yet);
        the default stall bound follows it."""
        return self._slowest_s

    def stall_report(self) -> list[dict]:
        """The workers the next step waits for, what they owe and their threads' stacks (see
        :class:`workers.stall.InputStallError`'s ``owed``), as the assignment knows them."""
        return self.assignment.stall_report()

    def with_stacks(self, owing: list) -> list[dict]:
        """``owing``, ``[(worker, [global batch numbers])]``, as ``owed`` entries, each worker's
        stacks asked for at once and waited for together (at most _DUMP_STACK_TIMEOUT_S)."""
        asked = []
        for wk, _ in owing:
            try:
                asked.append(wk.actor.thread_stacks.remote())
            except Exception as e:  # noqa: BLE001 (the actor is gone: said in its entry)
                asked.append(e)
        deadline = time.perf_counter() + _DUMP_STACK_TIMEOUT_S
        out = []
        for (wk, numbers), ref in zip(owing, asked):
            entry = {"wse_id": self.wse_id, "local_worker_id": wk.info.local_worker_id,
                     "pid": None, "threads": [], "note": "",
                     "batches": [(n, n - self.first_step + 1) for n in numbers]}
            try:
                if isinstance(ref, Exception):
                    raise ref
                got = ray.get(ref, timeout=max(0.1, deadline - time.perf_counter()))
                entry["pid"], entry["threads"] = got["pid"], got["threads"]
            except ray.exceptions.GetTimeoutError:
                entry["note"] = (f"(the worker did not answer within {_DUMP_STACK_TIMEOUT_S:.0f} "
                                 "s; its process may be stuck in native code holding the GIL)")
            except Exception as e:  # noqa: BLE001
                entry["note"] = f"(no stack: {type(e).__name__}: {_first_lines(str(e), 2)})"
            out.append(entry)
        return out

    def sample_keys(self) -> list[WorkerKeys]:
        """The sample keys of each worker's first :attr:`key_batches` batches of this stream
        (waits for them; they stay queued for :meth:`next`). A worker whose input fails or
        whose byte bound is full before then reports the keys it has."""
        return self.assignment.sample_keys()

    def peek_spec(self):
        """The next batch's nesting with every tensor as a ``meta`` tensor of its shape and
        dtype; the batch itself stays for :meth:`next`."""
        self.check_open()
        if self.peeked is None:
            self.peeked = self.assignment.next_reply()
        return tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"),
                             self.peeked[2])

    def worker_states(self) -> list[DataLoaderCheckpoint]:
        """One state per worker, at the position right after the batches consumed through
        :meth:`next`; ``CsxInputStream(..., resume_states=...)`` continues from there."""
        return self.assignment.worker_states()

    def ready_count(self) -> int:
        """Batches already produced and waiting for this CS-X."""
        return self.assignment.ready_count()

    @property
    def max_batches_ahead(self) -> int:
        """The most batches one worker can have produced beyond what :meth:`next` returned:
        the rest of the last reply, the requests in flight, the worker's buffer, and the batch
        being produced."""
        m = self.batches_per_fetch
        in_flight = self.in_flight_per_worker if m == 1 else m
        return (m - 1) + in_flight + self.capacity + 1

    def stats(self) -> dict:
        """:meth:`transport_stats`, and what the assignment records (see its ``stats``)."""
        return self.assignment.stats()

    def transport_stats(self) -> dict:
        """Per worker: batches delivered, batches/s, restarts, straggler reports; plus totals.

        Rates count from the first batch handed out (``startup_s`` is the time until then)."""
        asked = [wk.where_ref for wk in self.workers if wk.where_ref is not None]
        if asked and not self.closed:  # workers that have not said where they run yet
            with contextlib.suppress(Exception):
                ray.wait(asked, num_returns=len(asked), timeout=_WHERE_WAIT_S,
                         fetch_local=False)
        now = time.perf_counter()
        startup = (self._t_first if self._t_first is not None else now) - self._t_start
        elapsed = max(now - self._t_first, 1e-9) if self._t_first is not None else float("inf")
        workers = [{
            "local_worker_id": wk.info.local_worker_id,
            "batches": wk.delivered_this_run,
            "worker_step": wk.consumed,
            "batches_per_s": wk.delivered_this_run / elapsed,
            "bytes": wk.bytes,
            "restarts": wk.restarts,
            "straggler_reports": wk.straggler_reports,
            "replies": wk.replies,
            **_where_fields(self.node_of(wk, 0) if not self.closed else wk.node),
        } for wk in self.workers]
        batches = sum(w["batches"] for w in workers)
        return {
            "wse_id": self.wse_id,
            "num_workers": self.num_workers,
            "steps": self.step,
            "batches": batches,
            "batches_per_s": batches / elapsed,
            "bytes": sum(w["bytes"] for w in workers),
            "bytes_per_s": sum(w["bytes"] for w in workers) / elapsed,
            "in_flight_bytes_per_worker": self.in_flight_bytes_per_worker,
            "wait_s": self._wait_s,
            "startup_s": startup,
            "elapsed_s": now - self._t_start,
            "restarts": sum(w["restarts"] for w in workers),
            "stragglers": list(self._stragglers),
            "restart_events": list(self._restart_events),
            "workers": workers,
        }

    def close(self) -> None:
        """Kill this stream's actors and let its assignment stop; safe to call more than
        once."""
        if not self.closed:
            self._kill_workers()
        self.assignment.close()

    def _kill_workers(self) -> None:
        self.closed = True
        self.peeked = None
        workers = [wk for wk in self.workers if wk.actor is not None]
        # let producers leave input_fn first: a process killed while a thread is inside native
        # code (a torch op) aborts with a stack dump on the console
        stops = []
        for wk in workers:
            with contextlib.suppress(Exception):
                stops.append(wk.actor.stop.remote(_STOP_JOIN_S))
        if stops:
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=_STOP_JOIN_S + 0.5)
        for wk in self.workers:
            wk.pending.clear()
            wk.ready.clear()
            if wk.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(wk.actor, no_restart=True)
                wk.actor = None
        self._dataloader_ref = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"step {self.step}"
        return (f"CsxInputStream(CS-X {self.wse_id}, {self.num_workers} workers, "
                f"{self.dataloader.input_fn_name}, {state})")


class Assignment(Protocol):
    """Which input worker produces which global batch of a :class:`CsxInputStream`, and how
    the stream takes the batches back in order. The stream asks its assignment at each point
    where that matters; :class:`RoundRobin` is the static one, and
    :class:`workers.coordinator.Coordinator` the dynamic one."""

    def attach(self, stream: CsxInputStream) -> None:
        """Called once by ``stream`` before its workers start."""

    def begin(self) -> None:
        """Called once the stream's workers are started and asked for their first batches."""

    def spawn_options(self, wk: StreamWorker) -> dict:
        """More keyword arguments for ``wk``'s actor (:class:`InputWorker`)."""

    def started(self, wk: StreamWorker, actor) -> dict:
        """``actor`` is ``wk``'s new process (first start or restart); returns what the
        restart's record (``stats()["restart_events"]``) should say beyond the stream's."""

    def reply_min_batches(self, wk: StreamWorker) -> int:
        """The batches a fetch from ``wk`` waits for before it replies (the worker must be
        producing them)."""

    def waits_after_restart(self) -> bool:
        """Whether :meth:`CsxInputStream.receive_reply` waits for the reply of a restarted
        worker's new process (False: its caller has other replies to take first)."""

    def needs_numbers(self, wk: StreamWorker, drawn_ahead: int) -> None:
        """``wk``'s loader waits for a global batch number with ``drawn_ahead`` batches drawn
        and not yet produced."""

    def global_batch(self, wk: StreamWorker, reply: dict) -> int | None:
        """The global batch (0-based; step - 1) the worker's failed ``reply`` was for."""

    def next_reply(self) -> tuple[int, dict, Any]:
        """``(worker, reply, batch)`` of global batch ``stream.step``."""

    def stall_report(self) -> list[dict]:
        """See :meth:`CsxInputStream.stall_report`."""

    def sample_keys(self) -> list[WorkerKeys]:
        """See :meth:`CsxInputStream.sample_keys`."""

    def worker_states(self) -> list[DataLoaderCheckpoint]:
        """See :meth:`CsxInputStream.worker_states`."""

    def ready_count(self) -> int:
        """See :meth:`CsxInputStream.ready_count`."""

    def stats(self) -> dict:
        """The stream's :meth:`~CsxInputStream.transport_stats` and what this records."""

    def close(self) -> None:
        """Called by :meth:`CsxInputStream.close` once the workers are killed."""


class RoundRobin:
    """Static assignment: step ``s`` comes from worker ``s % num_workers_per_csx``, each
    worker producing its own shard in order."""

    stream: CsxInputStream

    def attach(self, stream: CsxInputStream) -> None:
        self.stream = stream

    def begin(self) -> None:
        pass

    def spawn_options(self, wk: StreamWorker) -> dict:
        return {}

    def started(self, wk: StreamWorker, actor) -> dict:
        return {}

    def reply_min_batches(self, wk: StreamWorker) -> int:
        return 1

    def waits_after_restart(self) -> bool:
        return True

    def needs_numbers(self, wk: StreamWorker, drawn_ahead: int) -> None:
        raise RuntimeError(  # pragma: no cover (round-robin workers never wait for numbers)
            f"CS-X {self.stream.wse_id}, input worker {wk.info.local_worker_id} asked for "
            "global batch numbers, but this stream assigns its batches round-robin")

    def global_batch(self, wk: StreamWorker, reply: dict) -> int | None:
        """The round-robin formula: worker ``w``'s batch ``i`` is global batch ``i * W + w``."""
        index = reply.get("index")
        return None if index is None else index * self.stream.num_workers + wk.info.local_worker_id

    def next_reply(self) -> tuple[int, dict, Any]:
        w = self.stream.step % self.stream.num_workers
        reply, batch = self.stream._receive(w)
        return w, reply, batch

    def stall_report(self) -> list[dict]:
        """The worker of step ``stream.step``; once the first batch is here and the duplicate
        check waits for the workers' first batches (:meth:`sample_keys`), the workers it
        waits for."""
        s = self.stream
        W = s.num_workers
        if s.peeked is None:
            return s.with_stacks([(s.workers[s.step % W], [s.step])])
        return s.with_stacks([(wk, [wk.received * W + wk.info.local_worker_id])
                              for wk in s.workers if wk.received < wk.keys_until])

    def sample_keys(self) -> list[WorkerKeys]:
        s = self.stream
        s.check_open()
        for wk in s.workers:
            while wk.received < wk.keys_until and not (
                    wk.ready and wk.ready[-1]["kind"] == "error"):
                if not s.receive_reply(wk):
                    break
        return [WorkerKeys(s.wse_id, wk.info.local_worker_id, list(wk.keys))
                for wk in s.workers]

    def worker_states(self) -> list[DataLoaderCheckpoint]:
        out = []
        for wk in self.stream.workers:
            i = wk.info
            out.append(DataLoaderCheckpoint(
                local_worker_id=i.local_worker_id, num_workers_per_csx=i.num_workers_per_csx,
                num_csx=i.num_csx, wse_id=i.wse_id, appliance_step=self.stream.step,
                worker_step=wk.consumed,
                samples_streamed=int(wk.consumed_after.get("samples_streamed", 0)),
                user_state_dict=copy.deepcopy(wk.consumed_after.get("user_state_dict", {})),
            ))
        return out

    def ready_count(self) -> int:
        """Batches here (peeked or received) and replies that have arrived."""
        s = self.stream
        if s.closed:
            return 0
        refs = [ref for wk in s.workers for _, ref in wk.pending]
        ready = 1 if s.peeked is not None else 0
        ready += sum(len(wk.ready) for wk in s.workers)
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            ready += len(done)
        return ready

    def stats(self) -> dict:
        return self.stream.transport_stats()

    def close(self) -> None:
        pass
