"""The input side of one CS-X on Ray: its :class:`~workers.input_worker.InputWorker` actors and
the merge of their batches into the CS-X's sequence of global batches.

The stream composes one :class:`~workers.link.WorkerLink` per worker (its actor, requests in
flight and replies received), a :class:`~workers.supervision.Supervisor` over them (stragglers,
restarts, placement) and an assignment chosen once when the workers have started
(:mod:`workers.assignment`: round-robin, step ``s`` of a CS-X from its local worker
``s % num_workers_per_csx``; or :class:`workers.coordinator.DynamicAssignment`). Each worker keeps
a few ``fetch`` requests outstanding so that transport overlaps production, and never runs more
than a bounded number of batches ahead of the consumer. A worker whose process dies is restarted
from the position right after the last batch received from it, so no batch is lost or
duplicated; an exception from ``input_fn`` stops the stream with :class:`InputWorkerError`.
Workers are spread round-robin over the cluster's live nodes, and a restarted one goes to a
live node away from the one it died on (:mod:`workers.placement`); :meth:`CsxInputStream.stats`
says where each runs and records every restart.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
import torch

from workers.assignment import AssignmentPlan, RoundRobinPlan, StreamParts
from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint, WorkerInfo
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.duplicates import WorkerKeys
from workers.errors import InputWorkerError, WorkerCrashLoopError
from workers.flow import FlowPolicy
from workers.link import (DEFAULT_NAME_PREFIX, LinkSetup, WorkerFailed, WorkerLink,
                          kill_named_workers, kill_workers, start_workers_ahead, worker_name)
from workers.local_stream import BatchInfo, sample_key_batches
from workers.replies import WorkerReply
from workers.resume import ExhaustedIteratorError, ResumeError, ResumeStates
from workers.supervision import StreamState, Supervisor
from workers.torch_compat import tree_map_only

__all__ = ["BatchInfo", "CsxInputStream", "kill_named_workers", "kill_workers",
           "start_workers_ahead"]

_STOP_JOIN_S = 1.0  # how long close() lets producers finish the batch they are making
_WHERE_WAIT_S = 2.0  # how long stats() waits for the workers to say where they run

_OWN_ERRORS = {cls.__name__: cls for cls in (EmptyDataLoaderError, ExhaustedIteratorError,
                                             ResumeError)}


def input_error(wse_id: int, local_worker_id: int, num_workers: int, reply: WorkerReply,
                global_batch: int | None = None) -> Exception:
    """The exception for a worker's failed reply: the input side's own errors (an empty or
    used-up loader, a position that cannot be resumed) as themselves, naming the worker;
    anything ``input_fn`` raised as :class:`InputWorkerError`, naming the global batch
    (``global_batch``, 0-based: the step is one more) the failed batch was for, where the
    stream knows it."""
    err = reply.error
    own = _OWN_ERRORS.get(err["exc_type"]) if err["exc_module"].startswith("workers.") else None
    if own is not None:
        return own(f"CS-X {wse_id}, input worker {local_worker_id}: {err['exc_message']}")
    return InputWorkerError(wse_id, local_worker_id, err["exc_type"], err["exc_message"],
                            err["traceback"], err["during"], num_workers, reply.index,
                            global_batch)


def local_object_store_bytes() -> int | None:
    """The size of this node's Ray object store (where the batches of this stream arrive)."""
    node = ray.get_runtime_context().get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node:
            return int(n.get("Resources", {}).get("object_store_memory", 0)) or None
    return None


def _where_fields(node: dict | None) -> dict:
    """A worker's node for its stats: ``node_id``, ``node_ip`` and ``pid`` (None if unknown)."""
    node = node or {}
    return {"node_id": node.get("node_id"), "node_ip": node.get("node_ip"),
            "pid": node.get("pid")}


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
    the order its assignment gives (:mod:`workers.assignment`).

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
        plan: how the assignment of global batches to workers is chosen (an
            :class:`~workers.assignment.AssignmentPlan`); None:
            :class:`~workers.assignment.RoundRobinPlan`.

    :attr:`workers` holds one :class:`~workers.link.WorkerLink` per local worker, and
    :attr:`step` the global batch :meth:`next` delivers next.

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
                 workers_ahead: list | None = None, plan: AssignmentPlan | None = None):
        _check_arguments(dataloader, cs_config, wse_id, policy, name_prefix)
        self.dataloader = dataloader
        self.cs_config = cs_config
        self.wse_id = wse_id
        self.policy = policy
        W = self.num_workers = cs_config.num_workers_per_csx
        in_flight_bytes = policy.input_bytes_per_worker(
            cs_config.num_csx, W, None if policy.input_bytes_in_flight_per_csx else
            local_object_store_bytes())
        plan = RoundRobinPlan() if plan is None else plan
        self.setup = LinkSetup(
            dataloader_ref=None, wse_id=wse_id, name_prefix=name_prefix, policy=policy,
            capacity=policy.worker_buffer_batches(bytes_bounded=in_flight_bytes is not None),
            in_flight_bytes_per_worker=in_flight_bytes,
            in_flight_per_worker=policy.requests_in_flight_per_worker,
            batches_per_fetch=policy.batches_per_fetch, zero_copy=bool(zero_copy),
            spawn_options=plan.spawn_options)
        self.state = StreamState(wse_id)
        self.peeked = None
        self._wait_s = 0.0
        self.workers = [WorkerLink(info=WorkerInfo(w, W, cs_config.num_csx, wse_id),
                                   name=worker_name(name_prefix, wse_id, w), setup=self.setup)
                        for w in range(W)]
        start = {"worker_step": 0, "samples_streamed": 0,
                 "user_state_dict": {"epoch": 0, "batch_in_epoch": 0}}
        for link in self.workers:
            link.start_at(start, 0)
        if resume_states is not None:
            after, self.step = ResumeStates(resume_states).checked(wse_id, W)
            for link in self.workers:
                link.start_at(after[link.w], int(after[link.w]["worker_step"]))
        self.state.first_step = self.step  # global batch number of this run's first step
        self._slowest_s: float | None = None  # the slowest batch delivered (its produce_s)
        key_batches = sample_key_batches(cs_config)
        for link in self.workers:
            link.keys_until = link.received + key_batches
        self.supervisor = Supervisor(cs_config, self.state, self.workers)
        self.setup.dataloader_ref = ray.put(dataloader)
        self._t_start = time.perf_counter()
        self._t_first: float | None = None
        self.assignment = None
        try:
            with self._failures():
                self._start_workers([] if workers_ahead is None else workers_ahead)
                self.assignment = plan.choose(StreamParts(
                    cs_config=cs_config, links=self.workers, supervisor=self.supervisor,
                    setup=self.setup, state=self.state,
                    max_batches_ahead=self.max_batches_ahead))
        except BaseException:
            self.close()
            raise

    def _start_workers(self, ahead: list) -> None:
        """Start every worker (taking those of ``ahead``, :func:`start_workers_ahead`'s row
        for this CS-X) and send each its first requests."""
        nodes = self.supervisor.placer.initial(self.num_workers,
                                               first=self.wse_id * self.num_workers)
        for link in self.workers:  # placed as start_workers_ahead places them
            w = link.w
            link.node = nodes[w]
            actor = ahead[w] if w < len(ahead) else None
            if actor is not None:
                ahead[w] = None  # taken: set up, or killed if that fails
            link.spawn(ahead=actor)
        for link in self.workers:
            link.request()

    @property
    def step(self) -> int:
        """The global batch :meth:`next` delivers next."""
        return self.state.step

    @step.setter
    def step(self, value: int) -> None:
        self.state.step = value

    @property
    def first_step(self) -> int:
        """The global batch of this run's first step."""
        return self.state.first_step

    @property
    def closed(self) -> bool:
        return self.state.closed

    def check_open(self) -> None:
        self.state.check_open()

    @contextlib.contextmanager
    def _failures(self):
        """A worker's failure or crash loop closes the stream and is raised as the input
        error (naming the global batch the failed batch was for, where the assignment knows
        it)."""
        try:
            yield
        except WorkerFailed as e:
            batch = None if self.assignment is None else \
                self.assignment.failed_batch(e.link, e.reply)
            self.close()
            raise input_error(self.wse_id, e.link.w, self.num_workers, e.reply, batch) from None
        except WorkerCrashLoopError:
            self.close()
            raise

    # -- the public interface -------------------------------------------------------------
    def next(self) -> tuple[Any, BatchInfo]:
        """The next batch of this CS-X (global batch :attr:`step`, from the worker the
        assignment gave it to) and its :class:`BatchInfo`."""
        self.check_open()
        t0 = time.perf_counter()
        if self.peeked is not None:
            (link, reply), self.peeked = self.peeked, None
        else:
            with self._failures():
                link, reply = self.assignment.next_reply()
        now = time.perf_counter()
        wait_s = now - t0
        if self._t_first is None:
            self._t_first = now
        info = BatchInfo(link.w, link.consumed, wait_s, reply.nbytes,
                         produced_unix=reply.produced_unix, received_unix=reply.received_unix,
                         produce_cpu_s=reply.produce_cpu_s)
        cost = reply.produce_s
        if cost is not None and (self._slowest_s is None or cost > self._slowest_s):
            self._slowest_s = cost
        link.delivered(reply)
        self.step += 1
        self._wait_s += wait_s
        return reply.take_batch(), info

    def peek_spec(self):
        """The next batch's nesting with every tensor as a ``meta`` tensor of its shape and
        dtype; the batch itself stays for :meth:`next`."""
        self.check_open()
        if self.peeked is None:
            with self._failures():
                self.peeked = self.assignment.next_reply()
        return tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"),
                             self.peeked[1].batch)

    def sample_keys(self) -> list[WorkerKeys]:
        """The sample keys of each worker's first batches of this stream (waits for them;
        they stay queued for :meth:`next`). A worker whose input fails or whose byte bound is
        full before then reports the keys it has."""
        self.check_open()
        with self._failures():
            self.assignment.wait_for_keys()
        return [WorkerKeys(self.wse_id, link.w, list(link.keys)) for link in self.workers]

    def worker_states(self) -> list[DataLoaderCheckpoint]:
        """One state per worker, at the position right after the batches consumed through
        :meth:`next`; ``CsxInputStream(..., resume_states=...)`` continues from there."""
        return self.assignment.resume_states()

    def ready_count(self) -> int:
        """Batches already produced and waiting for this CS-X."""
        return self.assignment.ready_count(self.peeked is not None)

    @property
    def max_batches_ahead(self) -> int:
        """The most batches one worker can have produced beyond what :meth:`next` returned:
        the rest of the last reply, the requests in flight, the worker's buffer, and the batch
        being produced."""
        s = self.setup
        m = s.batches_per_fetch
        in_flight = s.in_flight_per_worker if m == 1 else m
        return (m - 1) + in_flight + s.capacity + 1

    @property
    def in_flight_bytes_per_worker(self) -> int | None:
        return self.setup.in_flight_bytes_per_worker

    # -- stalls (workers.stall) ----------------------------------------------------------
    def slowest_batch_s(self) -> float | None:
        """The longest a worker took to produce a batch this stream delivered (None: none yet);
        the default stall bound follows it."""
        return self._slowest_s

    def stall_report(self) -> list[dict]:
        """The workers the next step waits for, what they owe and their threads' stacks (see
        :class:`workers.stall.InputStallError`'s ``owed``), as the assignment knows them;
        once the first batch is here, the duplicate check's wait for the workers' first
        batches."""
        return self.assignment.stall_report(keys_wait=self.peeked is not None)

    # -- figures --------------------------------------------------------------------------
    def stats(self) -> dict:
        """Per worker: batches delivered, batches/s, restarts, straggler reports, where it
        ran; totals; and what the assignment recorded (its mode and why, batch costs,
        straggler wait). Rates count from the first batch handed out (``startup_s`` is the
        time until then)."""
        return self.assignment.stats(self._transport_stats())

    def _transport_stats(self) -> dict:
        asked = [link.where_ref for link in self.workers if link.where_ref is not None]
        if asked and not self.closed:  # workers that have not said where they run yet
            with contextlib.suppress(Exception):
                ray.wait(asked, num_returns=len(asked), timeout=_WHERE_WAIT_S,
                         fetch_local=False)
        now = time.perf_counter()
        startup = (self._t_first if self._t_first is not None else now) - self._t_start
        elapsed = max(now - self._t_first, 1e-9) if self._t_first is not None else float("inf")
        workers = [{
            "local_worker_id": link.w,
            "batches": link.delivered_this_run,
            "worker_step": link.consumed,
            "batches_per_s": link.delivered_this_run / elapsed,
            "bytes": link.bytes,
            "restarts": link.restarts,
            "straggler_reports": link.straggler_reports,
            "replies": link.replies,
            **_where_fields(link.node_of(0) if not self.closed else link.node),
        } for link in self.workers]
        batches = sum(w["batches"] for w in workers)
        return {
            "wse_id": self.wse_id,
            "num_workers": self.num_workers,
            "steps": self.step,
            "batches": batches,
            "batches_per_s": batches / elapsed,
            "bytes": sum(w["bytes"] for w in workers),
            "bytes_per_s": sum(w["bytes"] for w in workers) / elapsed,
            "in_flight_bytes_per_worker": self.setup.in_flight_bytes_per_worker,
            "wait_s": self._wait_s,
            "startup_s": startup,
            "elapsed_s": now - self._t_start,
            "restarts": sum(w["restarts"] for w in workers),
            "stragglers": list(self.supervisor.stragglers),
            "restart_events": list(self.supervisor.restart_events),
            "workers": workers,
        }

    # -- closing --------------------------------------------------------------------------
    def close(self) -> None:
        """Kill this stream's actors and let its assignment stop; safe to call more than
        once."""
        if not self.closed:
            self._kill_workers()
        if self.assignment is not None:
            self.assignment.close()

    def _kill_workers(self) -> None:
        self.state.closed = True
        self.peeked = None
        live = [link for link in self.workers if link.actor is not None]
        # let producers leave input_fn first: a process killed while a thread is inside native
        # code (a torch op) aborts with a stack dump on the console
        stops = []
        for link in live:
            with contextlib.suppress(Exception):
                stops.append(link.actor.stop.remote(_STOP_JOIN_S))
        if stops:
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=_STOP_JOIN_S + 0.5)
        for link in self.workers:
            link.kill()
        self.setup.dataloader_ref = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"step {self.step}"
        return (f"CsxInputStream(CS-X {self.wse_id}, {self.num_workers} workers, "
                f"{self.dataloader.input_fn_name}, {state})")
