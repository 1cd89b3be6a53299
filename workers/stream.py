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
import threading
import time
from typing import Any, Sequence

import ray
import torch

from workers.assignment import StreamParts
from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.duplicates import WorkerKeys
from workers.errors import InputWorkerError, WorkerCrashLoopError
from workers.flow import FlowPolicy
from workers.link import (DEFAULT_NAME_PREFIX, NUM_CPUS, LinkSetup, WorkerFailed,
                          kill_named_workers, kill_workers, start_workers_ahead)
from workers.local_stream import BatchInfo, sample_key_batches
from workers.plans import AssignmentPlan, ConfiguredPlan, RoundRobinPlan
from workers.replies import WorkerReply
from workers.resume import ExhaustedIteratorError, ResumeError, ResumeStates
from workers.placement import NodePlacer
from workers.pool import StreamWorkers
from workers.positions import StreamPosition, WorkerPosition
from workers.supervision import StreamState, SupervisionRecord
from workers.torch_compat import tree_map_only

__all__ = ["BatchInfo", "CsxInputStream", "configured_stream", "kill_named_workers",
           "kill_workers", "start_workers_ahead"]


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


def _check_change(wse_id: int, active: list[int], add, retire: list[int],
                  support: tuple[bool, str]) -> None:
    """Refuse a change of a stream's workers that cannot be made, saying why."""
    if isinstance(add, bool) or not isinstance(add, int) or add < 0:
        raise ValueError(f"CsxInputStream.change_workers: add={add!r}; it must be an int >= 0 "
                         "(the number of workers to start).")
    if len(set(retire)) != len(retire) or not set(retire) <= set(active):
        raise ValueError(
            f"CS-X {wse_id}: cannot retire input worker(s) {retire}: the workers taking part "
            f"are {active}; name each one once.")
    if len(active) + add - len(retire) < 1:
        raise ValueError(
            f"CS-X {wse_id}: retiring {len(retire)} of the {len(active)} input workers taking "
            f"part (adding {add}) would leave none; keep at least one.")
    if not support[0]:
        raise ValueError(
            f"CS-X {wse_id}: the input workers of this stream cannot be changed while it runs: "
            f"{support[1]}. Check can_change_workers() before starting a change, or run with a "
            "fixed number of workers.")


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
            :class:`~workers.plans.AssignmentPlan`); None:
            :class:`~workers.plans.RoundRobinPlan` (round-robin); the run's streams are given
            :class:`~workers.plans.ConfiguredPlan` (``CSConfig.input_assignment``).

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
        at = StreamPosition(0, (WorkerPosition(),) * W) if resume_states is None else \
            ResumeStates(resume_states).checked(wse_id, W)
        self.step = at.step
        self.placer = NodePlacer(NUM_CPUS)
        self.pool = StreamWorkers(cs_config, wse_id, self.setup, self.placer,
                                  on_reform=self._forget_peeked)
        self.workers = self.pool.links
        self.workers.extend(self.pool.new_link(w, W, at.workers[w]) for w in range(W))
        self.state.first_step = self.step  # global batch number of this run's first step
        self._slowest_s: float | None = None  # the slowest batch delivered (its produce_s)
        key_batches = sample_key_batches(cs_config)
        for link in self.workers:
            link.keys_until = link.received + key_batches
        self.record = SupervisionRecord()
        self._boundary = threading.RLock()  # held by next() and the other step-boundary calls
        self.setup.dataloader_ref = ray.put(dataloader)
        self._t_start = time.perf_counter()
        self._t_first: float | None = None
        self.assignment = None
        try:
            with self._failures():
                self.pool.start_first([] if workers_ahead is None else workers_ahead)
                self.assignment = plan.choose(StreamParts(
                    cs_config=cs_config, links=self.workers, setup=self.setup,
                    state=self.state, max_batches_ahead=self.max_batches_ahead,
                    placer=self.placer, record=self.record))
        except BaseException:
            self.close()
            raise

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
        with self._boundary:
            return self._next()

    def _next(self) -> tuple[Any, BatchInfo]:
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
        with self._boundary, self._failures():
            if self.peeked is None:
                self.peeked = self.assignment.next_reply()
        return tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"),
                             self.peeked[1].batch)

    def sample_keys(self) -> list[WorkerKeys]:
        """The sample keys of each worker's first batches of this stream (waits for them;
        they stay queued for :meth:`next`). A worker whose input fails or whose byte bound is
        full before then reports the keys it has."""
        self.check_open()
        with self._boundary, self._failures():
            self.assignment.wait_for_keys()
        return [WorkerKeys(self.wse_id, link.w, list(link.keys)) for link in self.workers]

    def worker_states(self) -> list[DataLoaderCheckpoint]:
        """One state per worker, at the position right after the batches consumed through
        :meth:`next`; ``CsxInputStream(..., resume_states=...)`` continues from there."""
        with self._boundary:
            return self.assignment.resume_states()

    # -- changing the workers while the stream runs ---------------------------------------
    def can_change_workers(self) -> tuple[bool, str]:
        """Whether :meth:`change_workers` can change this stream's workers, and why (not):
        under dynamic assignment always; under round-robin where the workers' loader keeps
        its position in global batches (:func:`workers.loaders.worker_change_support`). The
        answer does not change while the stream runs: ask it before relying on a change."""
        self.check_open()
        return self.assignment.change_support()

    def active_workers(self) -> list[int]:
        """The local ids of the workers taking part (a retired worker leaves this list at
        once, though it may still make the batches it owes)."""
        return self.assignment.active_workers()

    def add_workers(self, count: int = 1) -> list[int]:
        """Start ``count`` more workers: :meth:`change_workers` ``(add=count)``."""
        return self.change_workers(add=count)

    def retire_workers(self, local_worker_ids: Sequence[int]) -> list[int]:
        """Retire these workers: :meth:`change_workers` ``(retire=local_worker_ids)``."""
        return self.change_workers(retire=local_worker_ids)

    def change_workers(self, add: int = 0, retire: Sequence[int] = ()) -> list[int]:
        """Start ``add`` more workers and retire those of ``retire`` (local ids) at the step
        boundary this call waits for (the end of a :meth:`next` in progress; safe from
        another thread). Returns the ids of the workers taking part afterwards. The stream's
        sequence of global batches stays the one of a fixed number of workers.

        Under dynamic assignment an added worker starts at the position after the last
        delivered batch and gets numbers once its process answers; a retired one gets no new
        numbers, hands back those it owes once live workers can make them all (else it makes
        them first), then its actor is killed; ids are never reused. Under round-robin every
        worker is re-formed from the exact position (as a resume with another worker count
        is): the batches made ahead are made again, and the ids are ``0..W-1`` afterwards.
        Raises ``ValueError`` where :meth:`can_change_workers` says no, an id is not taking
        part, or no worker would be left.
        """
        retire = [int(w) for w in retire]
        with self._boundary:
            self.check_open()
            _check_change(self.wse_id, self.active_workers(), add, retire,
                          self.assignment.change_support())
            if add or retire:
                with self._failures():
                    self.assignment = self.assignment.change_workers(add, retire, self.pool)
                self.num_workers = len(self.active_workers())
            return self.active_workers()

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
        if not self.closed:
            self.pool.wait_where()
        now = time.perf_counter()
        startup = (self._t_first if self._t_first is not None else now) - self._t_start
        elapsed = max(now - self._t_first, 1e-9) if self._t_first is not None else float("inf")
        figures = self.pool.figures(elapsed, self.closed)
        return {
            "wse_id": self.wse_id,
            "num_workers": self.num_workers,
            "steps": self.step,
            "batches": figures["batches"],
            "batches_per_s": figures["batches_per_s"],
            "bytes": figures["bytes"],
            "bytes_per_s": figures["bytes_per_s"],
            "in_flight_bytes_per_worker": self.setup.in_flight_bytes_per_worker,
            "wait_s": self._wait_s,
            "startup_s": startup,
            "elapsed_s": now - self._t_start,
            "restarts": figures["restarts"],
            "stragglers": list(self.record.stragglers),
            "restart_events": list(self.record.restart_events),
            "workers": figures["workers"],
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
        self.pool.kill_all()
        self.setup.dataloader_ref = None

    def _forget_peeked(self) -> None:
        """The workers are re-formed: the batch held for the next step is made again."""
        self.peeked = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"step {self.step}"
        return (f"CsxInputStream(CS-X {self.wse_id}, {self.num_workers} workers, "
                f"{self.dataloader.input_fn_name}, {state})")


def configured_stream(dataloader, cs_config, wse_id, *, resume_states=None,
                      **options) -> CsxInputStream:
    """The stream a run opens for CS-X ``wse_id``: its assignment follows
    ``cs_config.input_assignment`` (:class:`~workers.plans.ConfiguredPlan`); ``options`` as
    for :class:`CsxInputStream`."""
    return CsxInputStream(dataloader, cs_config, wse_id, resume_states=resume_states,
                          plan=ConfiguredPlan(cs_config, resume_states), **options)
