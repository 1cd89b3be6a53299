"""Which input worker produces which global batch of a CS-X: the :class:`Assignment` protocol,
what an assignment works with (:class:`StreamParts`) and records (:class:`AssignmentRecorder`),
and the static one, :class:`RoundRobin` (step ``s`` from worker ``s % W``). The dynamic one is
:class:`workers.coordinator.DynamicAssignment`; :mod:`workers.plans` chooses between them once,
when a stream's workers have started. An assignment takes replies from the
:class:`~workers.link.WorkerLink` s it is given.
"""

from __future__ import annotations

import collections
import random
import time
from dataclasses import dataclass
from typing import Optional, Protocol

import ray

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint
from workers.link import LinkSetup, WorkerFailed, WorkerLink
from workers.placement import NodePlacer
from workers.replies import WorkerReply
from workers.positions import RoundRobinOrder, StreamPosition, WorkerPosition
from workers.resume import ResumeStates
from workers.supervision import StreamState, SupervisionRecord, Supervisor

__all__ = ["Assignment", "AssignmentRecorder", "RoundRobin", "StreamParts", "WorkerPool",
           "cost_summary"]

_COST_SAMPLES = 4096  # batch costs kept per worker (a uniform sample of all of them)
_RECENT_COSTS = 64  # the assignment size follows the median of this many recent batch costs
_CHANGE_SUPPORT_WAIT_S = 600.0  # how long a worker's loader may take to be built (as the plan waits)


@dataclass
class StreamParts:
    """What an assignment works with: the stream's links (retired ones stay, marked), their
    setup, where the stream is (:attr:`state`), and what the assignment's supervisor
    (:meth:`supervise`) places and records."""

    cs_config: CSConfig
    links: list[WorkerLink]
    setup: LinkSetup
    state: StreamState
    max_batches_ahead: int
    placer: NodePlacer
    record: SupervisionRecord

    def supervise(self, **hooks) -> Supervisor:
        """A supervisor of the links, given the assignment's ``hooks`` (``on_restart``,
        ``waits_after_restart``: :class:`~workers.supervision.Supervisor`)."""
        return Supervisor(self.cs_config, self.state, self.links, self.placer, self.record,
                          **hooks)

    def active_links(self) -> list[WorkerLink]:
        """The links of the workers taking part (not retired)."""
        return [link for link in self.links if not link.retired]

    @property
    def wse_id(self) -> int:
        return self.state.wse_id

    def position(self) -> int:
        """The global batch the stream delivers next."""
        return self.state.step

    @property
    def first_step(self) -> int:
        """The global batch of this stream's first step."""
        return self.state.first_step

    def is_closed(self) -> bool:
        return self.state.closed


class WorkerPool(Protocol):
    """What an assignment that changes its workers asks of its stream."""

    def new_link(self, w: int, num_workers: int, at: WorkerPosition, generation: int = 0,
                 added: bool = False) -> WorkerLink:
        """A link for local worker ``w`` of ``num_workers``, resuming at ``at`` (not started);
        ``added``: it joins a running stream."""

    def start(self, links: list[WorkerLink]) -> None:
        """Start the links' actors and send their first requests."""

    def stop(self, links: list[WorkerLink]) -> None:
        """Stop the links' producers and kill their actors (their batches are dropped)."""

    def forget_peeked(self) -> None:
        """Drop the batch the stream holds for its next step (it will be made again)."""


class Assignment(Protocol):
    mode: str  # "static" or "dynamic", as the report names it
    reason: str
    supervisor: Supervisor

    def change_support(self) -> tuple[bool, str]:
        """Whether :meth:`change_workers` can change this stream's workers, and why (not)."""

    def active_workers(self) -> list[int]:
        """The local ids of the workers taking part (not retired, nor being retired)."""

    def change_workers(self, add: int, retire: list[int], pool: WorkerPool) -> Assignment:
        """Add ``add`` workers and retire those of ``retire`` (local worker ids) at the step
        boundary the stream is at; returns the assignment from then on (this one, or one
        over re-formed workers)."""

    def next_reply(self) -> tuple[WorkerLink, WorkerReply]:
        """The link and reply of global batch ``position()``; a worker's failure raises
        :class:`~workers.link.WorkerFailed`."""

    def failed_batch(self, link: WorkerLink, reply: WorkerReply) -> Optional[int]:
        """The global batch (0-based; step - 1) ``link``'s failed ``reply`` was for."""

    def wait_for_keys(self) -> None:
        """Wait until every worker delivered the batches that carry sample keys (or failed)."""

    def resume_states(self) -> list[DataLoaderCheckpoint]:
        """One state per worker at the position after the batches handed out."""

    def stall_report(self, keys_wait: bool) -> list[dict]:
        """The workers the next step waits for (``keys_wait``: the duplicate check waits for
        the workers' first batches), as ``owed`` entries with their stacks."""

    def ready_count(self, peeked: bool) -> int:
        """Batches produced and waiting (``peeked``: one is held by the stream)."""

    def stats(self, transport: dict) -> dict:
        """``transport`` (the stream's figures) with what the assignment recorded."""

    def close(self) -> None:
        """The stream is closed."""


def cost_summary(costs: list) -> dict | None:
    """``{"count", "mean_s", "p50_s", "p99_s", "max_s"}`` of batch costs in seconds."""
    if not costs:
        return None
    xs = sorted(costs)
    n = len(xs)

    def q(p):
        return xs[min(n - 1, max(0, round(p * (n - 1))))]

    return {"count": n, "mean_s": sum(xs) / n, "p50_s": q(0.5), "p99_s": q(0.99),
            "max_s": xs[-1]}


class AssignmentRecorder:
    """What the run report reads of an assignment: each worker's batch costs (a uniform sample,
    and the recent ones), the wait attributable to stragglers, and the time each waited for
    numbers."""

    def __init__(self, num_workers: int, requested: str, reason: str):
        W = num_workers
        self.requested, self.reason = requested, reason
        self.costs = [[] for _ in range(W)]
        # each worker's recent batch costs: their median sizes its assignment (a mean would
        # follow the moments a loaded machine preempted the worker, not its batches' work)
        self.recent_costs = [collections.deque(maxlen=_RECENT_COSTS) for _ in range(W)]
        self._seen = [0] * W
        self._rng = [random.Random(w) for w in range(W)]
        self.straggler_wait = [0.0] * W
        self.idle_s = [0.0] * W  # each worker's time waiting for its next number

    def add_worker(self) -> None:
        """One more worker (the next local id) is recorded."""
        w = len(self.costs)
        self.costs.append([])
        self.recent_costs.append(collections.deque(maxlen=_RECENT_COSTS))
        self._seen.append(0)
        self._rng.append(random.Random(w))
        self.straggler_wait.append(0.0)
        self.idle_s.append(0.0)

    def cost(self, w: int, cost) -> None:
        if cost is None:
            return
        self._seen[w] += 1
        self.recent_costs[w].append(cost)
        costs = self.costs[w]
        if len(costs) < _COST_SAMPLES:
            costs.append(cost)
        else:
            j = self._rng[w].randrange(self._seen[w])
            if j < _COST_SAMPLES:
                costs[j] = cost

    def stats(self, out: dict, mode: str, dynamic: Optional[dict] = None) -> dict:
        """``out`` (transport figures) with the assignment's: ``dynamic`` holds the dynamic
        assignment's own (``assigned_batches_per_worker``, ``reorder_window_batches``,
        ``draws_ahead``)."""
        out["assignment"] = {"requested": self.requested, "mode": mode, "reason": self.reason,
                             **(dynamic or dict.fromkeys(("assigned_batches_per_worker",
                                                          "reorder_window_batches",
                                                          "draws_ahead")))}
        out["straggler_wait_s"] = sum(self.straggler_wait)
        for entry in out["workers"]:
            w = entry["local_worker_id"]
            entry["batch_cost"] = cost_summary(self.costs[w])
            entry["straggler_wait_s"] = self.straggler_wait[w]
        return out


class RoundRobin:
    """Static assignment: step ``s`` comes from worker ``s % num_workers_per_csx``, each
    worker producing its own shard in order. The wait attributable to stragglers is the time
    a step waited while another worker had a later batch here or on its way."""

    mode = "static"

    def __init__(self, parts: StreamParts, recorder: AssignmentRecorder):
        self.parts, self.recorder = parts, recorder
        self.reason = recorder.reason
        self.num_workers = len(parts.links)
        self.order = RoundRobinOrder(self.num_workers)
        self.supervisor = parts.supervise()
        self._change_support: Optional[tuple[bool, str]] = None

    def next_reply(self) -> tuple[WorkerLink, WorkerReply]:
        p = self.parts
        link = p.links[self.order.worker_of(p.position())]
        t0 = time.perf_counter()
        ahead = not link.ready and self._others_ahead(link)
        if not link.ready:
            link.receive(self.supervisor)
        reply = link.take()
        if reply.failed:
            raise WorkerFailed(link, reply)
        if not link.pending:
            link.request()
        if ahead:
            self.recorder.straggler_wait[link.w] += time.perf_counter() - t0
        self.recorder.cost(link.w, reply.produce_s)
        return link, reply

    def _others_ahead(self, link: WorkerLink) -> bool:
        """Another worker than ``link``'s has a later batch here or on its way."""
        others = [o for o in self.parts.links if o is not link]
        if any(o.ready for o in others):
            return True
        refs = [o.pending[0][1] for o in others if o.pending]
        if not refs:
            return False
        done, _ = ray.wait(refs, num_returns=1, timeout=0, fetch_local=False)
        return bool(done)

    def failed_batch(self, link: WorkerLink, reply: WorkerReply) -> Optional[int]:
        """The round-robin formula (:class:`~workers.positions.RoundRobinOrder`)."""
        return None if reply.index is None else self.order.global_batch(link.w, reply.index)

    def wait_for_keys(self) -> None:
        for link in self.parts.links:
            while link.received < link.keys_until and not link.failed_here():
                if not link.receive(self.supervisor):
                    break

    def resume_states(self) -> list[DataLoaderCheckpoint]:
        p = self.parts
        return StreamPosition(p.position(), tuple(link.consumed_after for link in p.links)
                              ).checkpoints(p.cs_config.num_csx, p.wse_id)

    def stall_report(self, keys_wait: bool) -> list[dict]:
        """The worker of the next step; while the duplicate check waits for the workers'
        first batches, the workers it waits for."""
        p = self.parts
        if not keys_wait:
            step = p.position()
            owing = [(p.links[self.order.worker_of(step)], [step])]
        else:
            owing = [(link, [self.order.global_batch(link.w, link.received)])
                     for link in p.links if link.received < link.keys_until]
        return self.supervisor.with_stacks(owing, p.first_step)

    def ready_count(self, peeked: bool) -> int:
        """Batches here (peeked or received) and replies that have arrived."""
        p = self.parts
        if p.is_closed():
            return 0
        refs = [ref for link in p.links for _, ref in link.pending]
        ready = (1 if peeked else 0) + sum(len(link.ready) for link in p.links)
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            ready += len(done)
        return ready

    def stats(self, transport: dict) -> dict:
        return self.recorder.stats(transport, self.mode)

    def close(self) -> None:
        pass

    # -- changing the workers -------------------------------------------------------------
    def active_workers(self) -> list[int]:
        return [link.w for link in self.parts.links]

    def change_support(self) -> tuple[bool, str]:
        """Round-robin changes its workers by re-forming them from the exact position, which
        the workers' loader must keep in global batches
        (:func:`workers.loaders.worker_change_support`, asked of worker 0 once)."""
        if self._change_support is None:
            try:
                got = ray.get(self.parts.links[0].actor.worker_change_support.remote(),
                              timeout=_CHANGE_SUPPORT_WAIT_S)
            except ray.exceptions.RayError as e:
                return False, (f"input worker 0 did not say what its loader can do "
                               f"({type(e).__name__}) within {_CHANGE_SUPPORT_WAIT_S:.0f} s")
            self._change_support = (bool(got[0]), str(got[1]))
        return self._change_support

    def change_workers(self, add: int, retire: list[int], pool: WorkerPool) -> Assignment:
        """Re-form the workers at the step boundary: every worker is stopped, and
        ``W + add - len(retire)`` new ones start from the exact position after the batches
        handed out (:meth:`resume_states`, mapped onto the new count as a resume with another
        worker count is, :meth:`workers.resume.ResumeStates.remap`); the batches the old ones
        made ahead are made again. Worker ids are then ``0..W' - 1``."""
        p, W = self.parts, self.num_workers + add - len(retire)
        ok, why = self.change_support()
        if not ok:
            raise ValueError(
                f"CS-X {p.wse_id}: the workers of this round-robin stream cannot be changed "
                f"while it runs: {why}.")
        states = ResumeStates(self.resume_states()).remap(p.cs_config.num_csx, W)
        at = ResumeStates([st for st in states if st.wse_id == p.wse_id]).checked(p.wse_id, W)
        assert at.step == p.position(), (at.step, p.position())  # re-formed at the exact step
        generation = p.links[0].generation + 1
        pool.forget_peeked()
        pool.stop(list(p.links))
        p.links[:] = [pool.new_link(w, W, at.workers[w], generation) for w in range(W)]
        pool.start(p.links)
        return RoundRobin(p, AssignmentRecorder(W, self.recorder.requested, self.reason))


def dynamic_resume_states(parts: StreamParts,
                          after: Optional[WorkerPosition]) -> list[DataLoaderCheckpoint]:
    """Every worker taking part at position ``after`` (the one after the last delivered batch;
    None: nothing was delivered, every worker is where it started), numbered ``0..W - 1`` in
    the order they joined (:meth:`workers.positions.StreamPosition.shared`)."""
    links = parts.active_links()
    at = after or links[0].consumed_after
    return StreamPosition.shared(parts.position(), at, len(links)).checkpoints(
        parts.cs_config.num_csx, parts.wse_id)
