"""Autoscaling on the wafer's side: the run's :class:`~executor.autoscale.Controller`, stepped
at step boundaries from the wafer loop's step records, and its decisions carried out by the
feeder threads between two batches of their CS-X's stream.

The wafer loop calls :meth:`RunAutoscaler.after_step` with every step's record (and stamps the
worker count of each CS-X into it); every ``window_steps`` steps the controller reads the
window (:func:`executor.autoscale.observe`) and decides. A decision that changes a count is
logged (one line, with its reason) and queued for its CS-X; the CS-X's feeder thread takes it
before it asks its stream for the next batch (:meth:`apply`), and the stream adds or retires
the workers there. The stream keeps the wafer's sequence of global batches exact whatever its
worker count, so a decision changes only who produces the batches.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from typing import Optional

from executor.autoscale import Action, Controller, Decision, observe
from workers.errors import AutoscaleError
from workers.resume import ResumeStates

log = logging.getLogger("cstream")


def fixed_where_unchangeable(cs_config, refusal: AutoscaleError):
    """``cs_config`` without autoscaling, where the run's input cannot change its workers:
    ``refusal`` is raised when autoscaling was asked for (``"auto"``, an explicit
    ``Autoscale``), else logged once and the run keeps ``min_workers_per_csx`` fixed."""
    if cs_config.autoscale.required:
        raise refusal
    log.warning("cstream: num_workers_per_csx 0 or None chooses the input workers automatically; "
                "this run keeps %d per CS-X, since its input cannot change its workers: %s",
                cs_config.num_workers_per_csx, refusal)
    return dataclasses.replace(cs_config, autoscale=None)


def check_stream_kind(ray_workers: bool) -> None:
    """Autoscaling adds and retires Ray input workers: refuse it for in-process streams."""
    if not ray_workers:
        raise AutoscaleError(
            "CSConfig.num_workers_per_csx='auto' finds the input workers while the run runs, "
            "and this run streams its input in this process (in_process=True), where the "
            "workers run one after another: more of them would not feed the wafer faster. "
            "Give a fixed num_workers_per_csx, or run on Ray (in_process=False).")


def start_layouts(cs_config, resume_states) -> list[tuple]:
    """Per CS-X: the layout its stream starts with and its resume states (None: from the
    start). A fixed count maps saved states onto it (:meth:`ResumeStates.remap`); an
    autoscaled run resumes each CS-X at the count it was saved with (within the bounds), so
    the controller continues from where the saved run was."""
    C, W = cs_config.num_csx, cs_config.num_workers_per_csx
    if not resume_states:
        return [(cs_config, None)] * C
    states = ResumeStates(resume_states, "open_input").states
    out = []
    for c in range(C):
        n = W
        if cs_config.autoscaling:
            a = cs_config.autoscale
            saved = sum(1 for s in states if s.wse_id == c) or W
            n = min(max(saved, a.min_workers_per_csx), a.max_workers_per_csx)
        mapped = ResumeStates(states, "open_input").remap(C, n)
        cfg = cs_config if n == W else dataclasses.replace(cs_config, num_workers_per_csx=n)
        out.append((cfg, [s for s in mapped if s.wse_id == c]))
    return out


def check_reformable(streams: list, input_fn_name: str) -> None:
    """Refuse autoscaling where a stream cannot take or give up workers exactly."""
    for c, s in enumerate(streams):
        ok, why = s.can_change_workers()
        if not ok:
            raise AutoscaleError(
                f"CSConfig.num_workers_per_csx='auto': the loader {input_fn_name} builds in "
                f"CS-X {c}'s input workers cannot be re-formed exactly with another worker "
                f"count ({why}), so with workers joining or leaving the wafer's sequence would "
                "not stay a fixed-count run's. Do as that says, or give a fixed "
                "num_workers_per_csx.")


def cluster_cpus() -> Optional[float]:
    """The CPUs of the Ray cluster this process is part of (None: unknown)."""
    try:
        import ray

        return float(ray.cluster_resources().get("CPU", 0.0)) or None
    except Exception:  # not on Ray, or Ray is going away: no cluster limit
        return None


class RunAutoscaler:
    """Args:
        cs_config: the run's layout (``autoscale``: the bounds and target).
        live: each CS-X's workers as its stream starts (their local ids).
        buffer_capacity: batches each CS-X's input buffer holds.
        cluster_cpus: asked once a window: the cluster's CPUs now (None: unknown: no cluster
            limit); a node lost or joined changes the answer.
        state: a :meth:`state_dict` of an earlier run to continue from (what it learnt).
    """

    def __init__(self, cs_config, live: list[list[int]], buffer_capacity: int,
                 cluster_cpus=lambda: None, state: Optional[dict] = None):
        self.config = cs_config.autoscale
        self.controller = Controller(self.config, num_csx=cs_config.num_csx)
        if state is not None:
            self.controller.load_state_dict(state)
        for s, ids in zip(self.controller.csx, live):
            s.workers = len(ids)  # the streams' counts are where the run starts
        self.live = [list(ids) for ids in live]
        """Each CS-X's workers taking part, as its stream has them now (local ids)."""
        self.buffer_capacity = buffer_capacity
        self.cluster_cpus = cluster_cpus
        self._window: deque = deque(maxlen=self.config.window_steps + 1)
        self._pending: list[deque] = [deque() for _ in live]
        self._lock = threading.Lock()
        self.events: list[dict] = []
        """Every decision that changed a count, with when it was made and carried out."""
        self.history: list[tuple[int, list[int]]] = [(1, self.counts())]
        """(the first step of a count, per-CS-X counts): the start and every change the feeders
        made."""

    def counts(self) -> list[int]:
        """Each CS-X's workers taking part now."""
        return [len(ids) for ids in self.live]

    # -- the wafer loop's side ---------------------------------------------------------------
    def after_step(self, record: dict) -> list[Decision]:
        """Note a step's record; at a window's end step the controller. Returns its
        decisions (none between windows)."""
        with self._lock:
            record["num_workers"] = self.counts()
            live = [list(ids) for ids in self.live]
        self._window.append(record)
        if record["step"] % self.config.window_steps:
            return []
        records = list(self._window)
        before = records.pop(0) if len(records) > self.config.window_steps else None
        obs = observe(records, live, self.buffer_capacity, self.cluster_cpus(), before=before)
        decisions = self.controller.step(obs)
        for d in decisions:
            if d.action is Action.HOLD:
                continue
            log.info(d.line())
            with self._lock:
                self._pending[d.csx].append(d)
                self.events.append({**d.to_dict(), "decided_unix": time.time()})
        return decisions

    # -- the feeder threads' side --------------------------------------------------------------
    def apply(self, c: int, stream, position: int) -> None:
        """Carry out CS-X ``c``'s queued decisions on its ``stream``, whose next batch is
        global batch ``position`` (0-based): a step boundary of that stream."""
        while True:
            with self._lock:
                if not self._pending[c]:
                    return
                d = self._pending[c].popleft()
            t0 = time.perf_counter()
            if d.action is Action.ADD:
                ids = stream.add_workers(d.count)
            else:
                ids = stream.retire_workers(list(d.workers))
            with self._lock:
                self.live[c] = list(ids)
                self.history.append((position + 1, self.counts()))
                for e in reversed(self.events):
                    if e["csx"] == c and e["step"] == d.step and "applied_unix" not in e:
                        e.update(applied_unix=time.time(), applied_at_batch=position + 1,
                                 workers_after=list(ids),
                                 apply_s=time.perf_counter() - t0)
                        break

    # -- the run's record ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The controller's state (counts, phases, what it learnt, its decisions)."""
        return self.controller.state_dict()

    def summary(self) -> dict:
        """What the run's profile keeps: the bounds, each CS-X's settled state, every decision
        (with when it was carried out) and the counts over the batches."""
        with self._lock:
            return {"config": self.config.to_dict(), "settled": self.controller.settled(),
                    "decisions": [dict(e) for e in self.events],
                    "history": [{"from_step": s, "workers": list(n)} for s, n in self.history],
                    "state": self.controller.state_dict()}
