"""Which input worker produces which global batch of a CS-X, chosen once when its stream starts.

A stream is given an :class:`AssignmentPlan`: :class:`RoundRobinPlan` (step ``s`` from worker
``s % W``) or :class:`ConfiguredPlan` (``CSConfig.input_assignment``: dynamic where every
worker's loader can take part, :func:`workers.sharding.dynamic_assignment_support`, else
round-robin). The plan says how the workers start (:meth:`AssignmentPlan.spawn_options`); once
they have, it chooses the :class:`Assignment` -- a :class:`RoundRobin` or a
:class:`workers.coordinator.DynamicAssignment` -- and the stream asks that one alone from then
on. An assignment takes replies from the :class:`~workers.link.WorkerLink` s it is given and
records what the run report needs about stragglers in an :class:`AssignmentRecorder`.
"""

from __future__ import annotations

import collections
import copy
import random
import time
from dataclasses import dataclass
from typing import Optional, Protocol

import ray

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint
from workers.link import LinkSetup, WorkerFailed, WorkerLink
from workers.replies import WorkerReply
from workers.resume import ResumeStates, round_robin_step, start_position
from workers.supervision import StreamState, Supervisor

__all__ = ["Assignment", "AssignmentRecorder", "ConfiguredPlan", "RoundRobin", "RoundRobinPlan",
           "StreamParts", "cost_summary"]

_COST_SAMPLES = 4096  # batch costs kept per worker (a uniform sample of all of them)
_RECENT_COSTS = 64  # the assignment size follows the median of this many recent batch costs


@dataclass
class StreamParts:
    """What an assignment works with: the stream's links, their supervisor and setup, and
    where the stream is (:attr:`state`)."""

    cs_config: CSConfig
    links: list[WorkerLink]
    supervisor: Supervisor
    setup: LinkSetup
    state: StreamState
    max_batches_ahead: int

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


class Assignment(Protocol):
    mode: str  # "static" or "dynamic", as the report names it
    reason: str

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

    def next_reply(self) -> tuple[WorkerLink, WorkerReply]:
        p = self.parts
        link = p.links[p.position() % self.num_workers]
        t0 = time.perf_counter()
        ahead = not link.ready and self._others_ahead(link)
        if not link.ready:
            link.receive(p.supervisor)
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
        """The round-robin formula: worker ``w``'s batch ``i`` is global batch ``i * W + w``."""
        return None if reply.index is None else reply.index * self.num_workers + link.w

    def wait_for_keys(self) -> None:
        for link in self.parts.links:
            while link.received < link.keys_until and not link.failed_here():
                if not link.receive(self.parts.supervisor):
                    break

    def resume_states(self) -> list[DataLoaderCheckpoint]:
        out = []
        for link in self.parts.links:
            i = link.info
            out.append(DataLoaderCheckpoint(
                local_worker_id=i.local_worker_id, num_workers_per_csx=i.num_workers_per_csx,
                num_csx=i.num_csx, wse_id=i.wse_id, appliance_step=self.parts.position(),
                worker_step=link.consumed,
                samples_streamed=int(link.consumed_after.get("samples_streamed", 0)),
                user_state_dict=copy.deepcopy(link.consumed_after.get("user_state_dict", {})),
            ))
        return out

    def stall_report(self, keys_wait: bool) -> list[dict]:
        """The worker of the next step; while the duplicate check waits for the workers'
        first batches, the workers it waits for."""
        p, W = self.parts, self.num_workers
        if not keys_wait:
            step = p.position()
            owing = [(p.links[step % W], [step])]
        else:
            owing = [(link, [link.received * W + link.w])
                     for link in p.links if link.received < link.keys_until]
        return p.supervisor.with_stacks(owing, p.first_step)

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


class AssignmentPlan(Protocol):
    def spawn_options(self, restarts: int) -> dict:
        """More :class:`~workers.input_worker.InputWorker` arguments for a worker's process
        (``restarts``: how many times it was restarted before)."""

    def choose(self, parts: StreamParts) -> Assignment:
        """The assignment, once the workers have started."""


class RoundRobinPlan:
    """Round-robin whatever the configuration asks."""

    def spawn_options(self, restarts: int) -> dict:
        return {}

    def choose(self, parts: StreamParts) -> Assignment:
        W = len(parts.links)
        return RoundRobin(parts, AssignmentRecorder(W, "static", "the stream assigns round-robin"))


class ConfiguredPlan:
    """``CSConfig.input_assignment``: ``"static"`` is round-robin; ``"dynamic"`` starts every
    worker ready for numbers and, if their loaders all take part, a
    :class:`~workers.coordinator.DynamicAssignment` (every worker resuming from the furthest
    position among ``resume_states``, :meth:`workers.resume.ResumeStates.global_position`),
    else round-robin, saying why."""

    def __init__(self, cs_config: CSConfig, resume_states=None):
        self.requested = cs_config.input_assignment
        self.dynamic = self.requested == "dynamic"
        self.dynamic_start = None
        if resume_states is not None and self.dynamic:
            self.dynamic_start = ResumeStates(resume_states).global_position()

    def spawn_options(self, restarts: int) -> dict:
        if not self.dynamic:
            return {}
        start = self.dynamic_start if restarts == 0 else None
        return {"dynamic": True, "dynamic_start": None if start is None else
                start.get("user_state_dict") or start_position()}

    def choose(self, parts: StreamParts) -> Assignment:
        W = len(parts.links)
        if not self.dynamic:
            return RoundRobin(parts, AssignmentRecorder(
                W, self.requested, "CSConfig.input_assignment='static'"))
        modes, ahead = [], []
        for link in parts.links:
            try:
                mode, why, drawn = ray.get(link.actor.assignment_mode.remote())
            except ray.exceptions.RayError:
                mode, why, drawn = "failed", "", 0  # fetch reports what went wrong
            modes.append((mode, why))
            ahead.append(drawn)
        kinds = {m for m, _ in modes if m != "failed"}
        if kinds == {"dynamic"}:
            from workers.coordinator import DynamicAssignment

            return DynamicAssignment(parts, AssignmentRecorder(W, self.requested, modes[0][1]),
                                     ahead, self.dynamic_start)
        if "dynamic" in kinds:  # the stream closes itself as it raises
            raise RuntimeError(
                f"CS-X {parts.wse_id}: the input workers' loaders disagree on dynamic "
                f"assignment ({[m for m, _ in modes]}); input_fn must build the same kind "
                "of loader in every worker.")
        # a failed build is reported by the first fetch; round-robin then raises it
        reason = next((why for m, why in modes if m == "static"),
                      "the input workers could not build their dataloaders")
        return RoundRobin(parts, AssignmentRecorder(W, self.requested, reason))


def dynamic_resume_states(parts: StreamParts, after: Optional[dict]) -> list[DataLoaderCheckpoint]:
    """Every worker at position ``after`` (the one after the last delivered batch; None: each
    worker's own); ``worker_step`` values are a round-robin position, so the states resume in
    either mode."""
    W, total = len(parts.links), parts.position()
    out = []
    for link in parts.links:
        i = link.info
        a = after or link.consumed_after
        out.append(DataLoaderCheckpoint(
            local_worker_id=i.local_worker_id, num_workers_per_csx=W, num_csx=i.num_csx,
            wse_id=i.wse_id, appliance_step=total,
            worker_step=round_robin_step(total, i.local_worker_id, W),
            samples_streamed=int(a.get("samples_streamed", 0)),
            user_state_dict=copy.deepcopy(a.get("user_state_dict") or start_position())))
    return out
