"""The watch over one stream's workers: waiting for a reply while reporting stragglers,
restarting a worker whose process died (on a live node away from the one it died on,
:mod:`workers.placement`), and gathering the stacks of the workers a stalled step waits for.
What it saw (straggler reports, restart events) is kept for the stream's stats."""

from __future__ import annotations

import collections
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import ray

from workers import ray_compat
from workers.config import CSConfig
from workers.errors import StragglerWarning, WorkerCrashLoopError
from workers.link import WorkerFailed, WorkerLink, first_lines
from workers.placement import NodePlacer
from workers.replies import WorkerReply

__all__ = ["StreamState", "SupervisionRecord", "Supervisor"]

logger = logging.getLogger("workers.stream")

DUMP_STACK_TIMEOUT_S = 5.0
_MAX_STRAGGLER_RECORDS = 100


def node_label(node: dict | None) -> str:
    """``"<node id, 12 hex digits> (<ip>)"``, or ``"unknown"``."""
    if not node:
        return "unknown"
    return f"{node['node_id'][:12]} ({node.get('node_ip') or '?'})"


@dataclass
class StreamState:
    """Where one CS-X's stream is: the global batch it delivers next (:attr:`step`), the one
    its run started at, and whether it is closed. The stream updates it; the supervisor and
    the assignment read it."""

    wse_id: int
    step: int = 0
    first_step: int = 0
    closed: bool = False

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError(
                f"the input stream of CS-X {self.wse_id} is closed; create a new CsxInputStream "
                "(with resume_states=old.worker_states() to continue where it stopped)."
            )


@dataclass
class SupervisionRecord:
    """What the supervision of one stream saw, for its stats: straggler reports (the latest
    ``_MAX_STRAGGLER_RECORDS``) and restart events. It outlives a supervisor: a stream whose
    workers are re-formed keeps one record."""

    stragglers: list[dict] = field(default_factory=list)
    restart_events: list[dict] = field(default_factory=list)


class Supervisor:
    """Watches the :class:`~workers.link.WorkerLink` s of CS-X ``state.wse_id``.

    Args:
        placer: where new processes go (shared with the stream's first placement).
        record: where straggler reports and restart events are kept.
        on_restart: what a restart's event says beyond this one's (the assignment's: the
            numbers the dead process owed); called with the link once its new process is
            started.
        waits_after_restart: whether :meth:`await_reply` waits for the reply of a restarted
            worker's new process (False: its caller has other replies to take first).
    """

    def __init__(self, cs_config: CSConfig, state: StreamState, links: list[WorkerLink],
                 placer: NodePlacer, record: SupervisionRecord,
                 on_restart: Callable[[WorkerLink], dict] = lambda link: {},
                 waits_after_restart: bool = True):
        self.cs_config, self.state, self.links = cs_config, state, links
        self.wse_id = state.wse_id
        self.check_open = state.check_open
        self.placer = placer
        self.poll_s = min(0.25, cs_config.straggler_timeout_s / 4)
        self.stragglers = record.stragglers
        self.restart_events = record.restart_events
        self.on_restart = on_restart
        self.waits_after_restart = waits_after_restart

    # -- waiting --------------------------------------------------------------------------
    def await_reply(self, link: WorkerLink) -> Optional[tuple[int, dict]]:
        """``(index, reply body)`` of ``link``'s oldest outstanding request, waited for as
        long as it takes (reporting a straggler every ``straggler_timeout_s`` and more),
        restarting the worker whose process died; None once it was restarted and
        :attr:`waits_after_restart` is False."""
        timeout = self.cs_config.straggler_timeout_s
        wait_start = time.perf_counter()
        next_report = timeout
        while True:
            self.check_open()
            index, ref = link.pending[0]
            try:
                return index, ray.get(ref, timeout=self.poll_s).body
            except ray.exceptions.GetTimeoutError:
                waited = time.perf_counter() - wait_start
                if waited >= next_report:
                    self.report_straggler(link, waited)
                    next_report = max(2 * next_report, waited + timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                    ray.exceptions.OwnerDiedError) as e:
                self.check_open()
                if ray_compat.actor_init_failed(e):
                    raise WorkerFailed(link, WorkerReply.failure(
                        type(e).__name__, first_lines(str(e), 2), "while starting its actor",
                        traceback=str(e), index=index)) from None
                self.restart(link, e)
                if not self.waits_after_restart:
                    return None
                wait_start, next_report = time.perf_counter(), timeout
            except ray.exceptions.RayTaskError as e:
                raise WorkerFailed(link, WorkerReply.failure(
                    type(e).__name__, first_lines(str(e), 2), "in its fetch call",
                    traceback=str(e), index=index)) from None

    # -- restarts -------------------------------------------------------------------------
    def restart(self, link: WorkerLink, cause: BaseException) -> None:
        """Start a new process for ``link``, whose process died of ``cause``, from the position
        after the last batch received from it; past ``max_worker_restarts``, raise
        :class:`WorkerCrashLoopError`."""
        link.restarts += 1
        w, limit = link.w, self.cs_config.max_worker_restarts
        cause_text = f"{type(cause).__name__}: {first_lines(str(cause))}"
        died_on = link.node_of(0)
        if link.restarts > limit:
            raise WorkerCrashLoopError(self.wse_id, w, link.restarts, limit, cause_text)
        # the node it died on may be dying too (Ray lists it alive for a while): the new
        # process goes to a live node with the fewest of this CS-X's workers
        self.placer.suspect(died_on and died_on["node_id"])
        load = collections.Counter(o.node["node_id"] for o in self.links
                                   if o is not link and o.node and not o.retired)
        node = self.placer.replacement(load)
        event = {
            "t_unix": time.time(), "wse_id": self.wse_id, "local_worker_id": w,
            "restart": link.restarts, "step": self.state.step, "from_batch": link.received,
            "cause": cause_text.splitlines()[0], "died_on": node_label(died_on),
            "restarted_on": node_label(node)}
        self.restart_events.append(event)
        logger.warning(
            "CS-X %d, input worker %d died on node %s (%s); restarting it from batch %d on node "
            "%s (restart %d of at most %d).", self.wse_id, w, node_label(died_on), cause_text,
            link.received, node_label(node), link.restarts, limit)
        link.respawn(node)
        event.update(self.on_restart(link))
        link.request()

    # -- stragglers and stalls ------------------------------------------------------------
    def report_straggler(self, link: WorkerLink, waited: float) -> None:
        try:
            stack = ray.get(link.actor.dump_stack.remote(), timeout=DUMP_STACK_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            stack = (f"(the worker did not answer dump_stack within {DUMP_STACK_TIMEOUT_S:.0f} s; "
                     "its process may be stuck in native code)")
        except ray.exceptions.RayError as e:
            stack = f"(no stack: {type(e).__name__}: {first_lines(str(e), 2)})"
        link.straggler_reports += 1
        w, step = link.w, self.state.step
        msg = (
            f"CS-X {self.wse_id}, input worker {w} is a straggler: it has delivered nothing for "
            f"{waited:.1f} s (straggler_timeout_s={self.cs_config.straggler_timeout_s}) while step "
            f"{step + 1} (global batch {step}) waits for its batch {link.received}. The "
            f"stream keeps waiting, since that step can only come from worker {w}. Its Python "
            f"stack:\n{stack}"
        )
        record = {"wse_id": self.wse_id, "local_worker_id": w, "waited_s": round(waited, 3),
                  "step": step, "worker_step": link.received, "stack": stack}
        self.stragglers.append(record)
        del self.stragglers[:-_MAX_STRAGGLER_RECORDS]
        warnings.warn(msg, StragglerWarning, stacklevel=5)

    def with_stacks(self, owing: list, first_step: int) -> list[dict]:
        """``owing``, ``[(link, [global batch numbers])]``, as ``owed`` entries (see
        :class:`workers.stall.InputStallError`), each worker's stacks asked for at once and
        waited for together (at most DUMP_STACK_TIMEOUT_S)."""
        asked = []
        for link, _ in owing:
            try:
                asked.append(link.actor.thread_stacks.remote())
            except Exception as e:  # noqa: BLE001 (the actor is gone: said in its entry)
                asked.append(e)
        deadline = time.perf_counter() + DUMP_STACK_TIMEOUT_S
        out = []
        for (link, numbers), ref in zip(owing, asked):
            entry = {"wse_id": self.wse_id, "local_worker_id": link.w,
                     "pid": None, "threads": [], "note": "",
                     "batches": [(n, n - first_step + 1) for n in numbers]}
            try:
                if isinstance(ref, Exception):
                    raise ref
                got = ray.get(ref, timeout=max(0.1, deadline - time.perf_counter()))
                entry["pid"], entry["threads"] = got["pid"], got["threads"]
            except ray.exceptions.GetTimeoutError:
                entry["note"] = (f"(the worker did not answer within {DUMP_STACK_TIMEOUT_S:.0f} "
                                 "s; its process may be stuck in native code holding the GIL)")
            except Exception as e:  # noqa: BLE001
                entry["note"] = f"(no stack: {type(e).__name__}: {first_lines(str(e), 2)})"
            out.append(entry)
        return out
