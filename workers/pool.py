"""The input workers of one stream: their links, made, started where Ray has room, stopped, and
their figures. A stream's assignment changes them through it
(:class:`workers.assignment.WorkerPool`); the links of workers re-formed away stay counted in
the totals."""

from __future__ import annotations

import collections
import contextlib
from typing import Callable

import ray

from workers.config import CSConfig
from workers.context import WorkerInfo
from workers.link import LinkSetup, WorkerLink, worker_name
from workers.placement import NodePlacer
from workers.positions import WorkerPosition

__all__ = ["StreamWorkers"]

_STOP_JOIN_S = 1.0  # how long a stop lets producers finish the batch they are making
_WHERE_WAIT_S = 2.0  # how long figures() waits for the workers to say where they run


def _where_fields(node: dict | None) -> dict:
    """A worker's node for its stats: ``node_id``, ``node_ip`` and ``pid`` (None if unknown)."""
    node = node or {}
    return {"node_id": node.get("node_id"), "node_ip": node.get("node_ip"),
            "pid": node.get("pid")}


class StreamWorkers:
    """The workers of CS-X ``wse_id``'s stream. ``on_reform``: what the stream drops when its
    workers are re-formed (the batch it holds for its next step: it is made again)."""

    def __init__(self, cs_config: CSConfig, wse_id: int, setup: LinkSetup, placer: NodePlacer,
                 on_reform: Callable[[], None]):
        self.cs_config, self.wse_id, self.setup, self.placer = cs_config, wse_id, setup, placer
        self.on_reform = on_reform
        self.links: list[WorkerLink] = []  # the assignment's links (retired ones stay)
        self.former: list[WorkerLink] = []  # re-formed away: counted in the totals

    def new_link(self, w: int, num_workers: int, at: WorkerPosition, generation: int = 0,
                 added: bool = False) -> WorkerLink:
        """A link for local worker ``w`` of ``num_workers``, resuming at ``at``; not
        started."""
        link = WorkerLink(info=WorkerInfo(w, num_workers, self.cs_config.num_csx, self.wse_id),
                          name=worker_name(self.setup.name_prefix, self.wse_id, w,
                                           generation=generation),
                          setup=self.setup, generation=generation, added=added)
        link.start_at(at)
        return link

    def start_first(self, ahead: list) -> None:
        """Start the stream's first workers (taking those of ``ahead``,
        :func:`~workers.link.start_workers_ahead`'s row for this CS-X, placed as it places
        them) and send each its first requests."""
        W = len(self.links)
        nodes = self.placer.initial(W, first=self.wse_id * W)
        for link in self.links:
            w = link.w
            link.node = nodes[w]
            actor = ahead[w] if w < len(ahead) else None
            if actor is not None:
                ahead[w] = None  # taken: set up, or killed if that fails
            link.spawn(ahead=actor)
        for link in self.links:
            link.request()

    def start(self, links: list[WorkerLink]) -> None:
        """Start the actors of ``links`` (joining a running stream) on the live nodes with
        the fewest of this stream's workers, and send their first requests."""
        load = collections.Counter(o.node["node_id"] for o in self.links
                                   if o.node and not o.retired and o.actor is not None
                                   and o not in links)
        for link in links:  # each one counted where it goes: a batch of new workers spreads
            link.node = self.placer.replacement(load)
            if link.node is not None:
                load[link.node["node_id"]] += 1
            link.spawn()
        for link in links:
            link.request()

    def forget_peeked(self) -> None:
        self.on_reform()

    def stop(self, links: list[WorkerLink]) -> None:
        """Let the producers of ``links`` leave ``input_fn``, then kill their actors; they
        are counted in the totals from now on."""
        self.stop_actors([link for link in links if link.actor is not None])
        for link in links:
            link.kill()
            link.retired = True
        self.former.extend(links)

    def kill_all(self) -> None:
        """Stop every worker's producer, then kill its actor (the stream is closed)."""
        self.stop_actors([link for link in self.links if link.actor is not None])
        for link in self.links:
            link.kill()

    @staticmethod
    def stop_actors(live: list[WorkerLink]) -> None:
        """Let the producers of ``live`` leave ``input_fn``: a process killed while a thread
        is inside native code (a torch op) aborts with a stack dump on the console."""
        stops = []
        for link in live:
            with contextlib.suppress(Exception):
                stops.append(link.actor.stop.remote(_STOP_JOIN_S))
        if stops:
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=_STOP_JOIN_S + 0.5)

    def wait_where(self) -> None:
        """Wait (at most ``_WHERE_WAIT_S``) for the workers that have not said where they
        run yet."""
        asked = [link.where_ref for link in self.links if link.where_ref is not None]
        if asked:
            with contextlib.suppress(Exception):
                ray.wait(asked, num_returns=len(asked), timeout=_WHERE_WAIT_S,
                         fetch_local=False)

    def figures(self, elapsed: float, closed: bool) -> dict:
        """Per worker (``workers``) and in all (the workers re-formed away included):
        batches, bytes, restarts; rates over ``elapsed`` seconds."""
        workers = [{
            "local_worker_id": link.w,
            "batches": link.delivered_this_run,
            "worker_step": link.consumed,
            "batches_per_s": link.delivered_this_run / elapsed,
            "bytes": link.bytes,
            "restarts": link.restarts,
            "straggler_reports": link.straggler_reports,
            "replies": link.replies,
            **_where_fields(link.node_of(0) if not closed else link.node),
        } for link in self.links]
        former = self.former
        batches = sum(w["batches"] for w in workers) + \
            sum(link.delivered_this_run for link in former)
        nbytes = sum(w["bytes"] for w in workers) + sum(link.bytes for link in former)
        return {"batches": batches, "batches_per_s": batches / elapsed, "bytes": nbytes,
                "bytes_per_s": nbytes / elapsed,
                "restarts": sum(w["restarts"] for w in workers) +
                sum(link.restarts for link in former),
                "workers": workers}
