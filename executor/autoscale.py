"""The autoscaling controller: how many input workers each CS-X needs, found while the run runs.

A run whose ``CSConfig.num_workers_per_csx`` is ``"auto"`` (or 0, or None) has one
:class:`Controller`. At step boundaries the run hands it an :class:`Observation`: per CS-X, the
wafer's figures over the last window of steps (its compute and input wait, how full its input
buffer was, and each worker's batches, production time and CPU time) and the CPUs the cluster
has free. :meth:`Controller.step` returns one :class:`Decision` per CS-X -- add ``k`` workers,
retire workers, or hold -- each with its reason in words. It reads no clock and calls no Ray:
tests step it by hand over recorded figures, and its :meth:`~Controller.state_dict` goes into
checkpoints.

The rules, per CS-X (``n`` workers, the bounds and target of :class:`workers.config.Autoscale`):

* a window that begins within ``cooldown_steps`` of the last change, is shorter than
  ``window_steps``, or in which a worker delivered nothing (still starting) decides nothing;
* the wafer *starves* when it computed less than ``target_utilisation`` of the window and its
  input wait is most of the shortfall (a wafer held back by the client gets no workers). It
  then gets the workers that produce what it takes: ``ceil(demand / rate per worker)`` in one
  decision (a new worker's process takes seconds to start: one start-up, not several),
  within ``max_workers_per_csx``, within the CPUs the cluster has free (each new worker needs
  what one uses now), and never past a count where adding gained nothing;
* after an add, the next window checks the gain: production that rose by less than ``min_gain``
  of what the added workers should produce means the machine's cores are the limit; the
  controller retires them again and adds no more there;
* the wafer is *fed* when it computed at least the target; a worker is retired when the buffer
  stayed full (a mean of at least all but one batch) and the other workers produce at least
  ``1 + retire_margin`` times what the wafer takes; a retire that starved the wafer is
  remembered, and that count is kept while the wafer takes as much.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Optional

from workers.config import Autoscale

STATE_FORMAT = "cstream.autoscale/1"


class Phase(enum.Enum):
    """Where one CS-X's autoscaling stands."""
    STARTING = "starting"            # no window read yet
    COOLING_DOWN = "cooling down"    # a change's figures are not in yet
    GROWING = "growing"              # the last decision added workers
    SHRINKING = "shrinking"          # the last decision retired workers
    SETTLED = "settled"              # the wafer is fed and no worker is spare
    LIMITED = "limited"              # the wafer starves, and a bound, the cores or the cluster stop adding


class Action(enum.Enum):
    ADD = "add"
    RETIRE = "retire"
    HOLD = "hold"


@dataclass(frozen=True)
class WorkerWindow:
    """One input worker's figures over a window."""
    worker: int
    batches: int
    """Batches it delivered to the wafer in the window."""
    produce_s: float
    """Seconds it spent producing them (its rate is ``batches / produce_s``)."""
    cpu_s: float
    """CPU seconds it spent producing them."""

    @property
    def rate(self) -> Optional[float]:
        """Batches/s it can produce (None: it delivered nothing)."""
        return self.batches / self.produce_s if self.batches and self.produce_s > 0 else None


@dataclass(frozen=True)
class CsxWindow:
    """One CS-X's figures over a window of steps."""
    csx: int
    first_step: int
    """The window's first step (counted from 1)."""
    last_step: int
    wall_s: float
    """Wafer time from the end of the step before the window to the end of its last."""
    compute_s: float
    input_wait_s: float
    mean_buffer_batches: float
    """Batches ready in the CS-X's input buffer when each step began, averaged."""
    buffer_capacity: int
    workers: tuple = ()
    """A :class:`WorkerWindow` per worker of the CS-X (those that delivered nothing too)."""

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    @property
    def busy(self) -> float:
        return self.compute_s / self.wall_s if self.wall_s > 0 else 1.0

    @property
    def starved(self) -> float:
        return self.input_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def demand(self) -> float:
        """Batches/s the wafer takes when it never waits."""
        return self.steps / self.compute_s if self.compute_s > 0 else math.inf

    @property
    def production(self) -> float:
        """Batches/s the workers can produce together."""
        return sum(w.rate or 0.0 for w in self.workers)

    @property
    def rate_per_worker(self) -> Optional[float]:
        rates = [w.rate for w in self.workers if w.rate is not None]
        return sum(rates) / len(rates) if rates else None

    @property
    def cpu_per_worker(self) -> float:
        """CPU cores one worker uses while it produces."""
        timed = [w for w in self.workers if w.produce_s > 0]
        return (sum(w.cpu_s for w in timed) / sum(w.produce_s for w in timed)) if timed else 0.0


@dataclass(frozen=True)
class Observation:
    """What the controller reads at a step boundary."""
    step: int
    """Steps the wafer has finished."""
    csx: tuple
    """A :class:`CsxWindow` per CS-X."""
    cluster_cpus: Optional[float] = None
    """The cluster's CPUs (None: unknown, no cluster limit)."""
    free_cpus: Optional[float] = None
    """Its CPUs the input workers and the wafer did not use over the window (None: unknown)."""


@dataclass(frozen=True)
class Decision:
    action: Action
    csx: int
    step: int
    """The step boundary it was made at."""
    reason: str
    count: int = 0
    """Workers to add (ADD)."""
    workers: tuple = ()
    """The local ids of the workers to retire (RETIRE)."""

    def line(self) -> str:
        """The decision in one log line."""
        what = {Action.ADD: f"add {self.count} worker{'s' if self.count != 1 else ''}",
                Action.RETIRE: f"retire worker{'s' if len(self.workers) != 1 else ''} "
                               f"{', '.join(map(str, self.workers))}",
                Action.HOLD: "hold"}[self.action]
        return f"autoscale CS-X {self.csx} at step {self.step}: {what}: {self.reason}"

    def to_dict(self) -> dict:
        return {"action": self.action.value, "csx": self.csx, "step": self.step,
                "count": self.count, "workers": list(self.workers), "reason": self.reason}


@dataclass
class CsxState:
    """What the controller keeps of one CS-X: its count, its phase and what it learnt."""
    workers: int
    phase: Phase = Phase.STARTING
    changed_at: int = 0
    """The step boundary of the last change (0: none)."""
    settled_since: Optional[int] = None
    """The first step of the first window read as settled since the last change."""
    added: Optional[dict] = None
    """The last add, until the next window checks its gain: from, to, production before, the
    rate one worker produced."""
    retired: Optional[dict] = None
    """The last retire, until the next window says whether the rest carried it: from, demand."""
    ceiling: Optional[int] = None
    """Learnt: more workers than this gained nothing (the machine's cores are the limit)."""
    floor: Optional[dict] = None
    """Learnt: retiring below ``workers`` starved a wafer taking ``demand`` batches/s."""
    last_reason: str = ""

    def to_dict(self) -> dict:
        return {"workers": self.workers, "phase": self.phase.value,
                "changed_at": self.changed_at, "settled_since": self.settled_since,
                "added": self.added, "retired": self.retired, "ceiling": self.ceiling,
                "floor": self.floor, "last_reason": self.last_reason}

    @classmethod
    def from_dict(cls, d: dict) -> "CsxState":
        return cls(workers=int(d["workers"]), phase=Phase(d["phase"]),
                   changed_at=int(d["changed_at"]), settled_since=d.get("settled_since"),
                   added=d.get("added"), retired=d.get("retired"), ceiling=d.get("ceiling"),
                   floor=d.get("floor"), last_reason=d.get("last_reason", ""))


def _newest(w: CsxWindow, k: int) -> tuple:
    """The ``k`` workers of the window started last (the highest local ids)."""
    return tuple(sorted(x.worker for x in w.workers)[-k:])


def _pct(x: float) -> str:
    return f"{math.floor(1000 * x + 1e-9) / 10:.1f}%"


def _w(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


@dataclass
class Controller:
    """The autoscaling controller of one run (see the module docstring).

    >>> from workers.config import Autoscale
    >>> c = Controller(Autoscale(window_steps=10, cooldown_steps=5), num_csx=1)
    >>> w = CsxWindow(csx=0, first_step=11, last_step=20, wall_s=1.0, compute_s=0.5,
    ...               input_wait_s=0.5, mean_buffer_batches=0.0, buffer_capacity=4,
    ...               workers=(WorkerWindow(0, 10, 1.0, 0.01),))
    >>> d, = c.step(Observation(step=20, csx=(w,)))
    >>> d.action.value, d.count, c.counts()
    ('add', 1, [2])
    """

    config: Autoscale
    num_csx: int
    start: Optional[int] = None
    """The count every CS-X starts at (None: ``config.min_workers_per_csx``)."""
    csx: list = field(default_factory=list)
    decisions: list = field(default_factory=list)
    """Every decision that changed a count, as dicts (the run's record of them)."""

    def __post_init__(self):
        if not self.csx:
            n = self.config.min_workers_per_csx if self.start is None else self.start
            self.csx = [CsxState(workers=n) for _ in range(self.num_csx)]

    def counts(self) -> list[int]:
        return [s.workers for s in self.csx]

    # -- the one transition ------------------------------------------------------------------
    def step(self, obs: Observation) -> list[Decision]:
        """One decision per CS-X for the figures of ``obs``; the counts change with them."""
        out = []
        free = obs.free_cpus
        for window in obs.csx:
            state = self.csx[window.csx]
            d = self._decide(state, window, obs, free)
            state.last_reason = d.reason
            if d.action is Action.ADD:
                free = None if free is None else free - d.count * window.cpu_per_worker
                state.workers += d.count
            elif d.action is Action.RETIRE:
                state.workers -= len(d.workers)
            if d.action is not Action.HOLD:
                state.changed_at = obs.step
                state.settled_since = None
                self.decisions.append(d.to_dict())
            out.append(d)
        return out

    def _hold(self, state: CsxState, window: CsxWindow, phase: Phase, reason: str) -> Decision:
        state.phase = phase
        return Decision(Action.HOLD, window.csx, window.last_step, reason)

    def _decide(self, s: CsxState, w: CsxWindow, obs: Observation,
                free: Optional[float]) -> Decision:
        cfg = self.config
        cool_until = s.changed_at + cfg.cooldown_steps if s.changed_at else 0
        if w.first_step <= cool_until:
            return self._hold(s, w, Phase.COOLING_DOWN if s.changed_at else s.phase,
                              f"cooling down: the figures from step {cool_until + 1} on decide")
        idle = [x.worker for x in w.workers if not x.batches]
        fed = w.busy >= cfg.target_utilisation and \
            w.mean_buffer_batches >= w.buffer_capacity - 1
        if idle and fed and s.workers > cfg.min_workers_per_csx \
                and len(w.workers) == s.workers:
            s.added, s.phase = None, Phase.SHRINKING
            return Decision(
                Action.RETIRE, w.csx, w.last_step,
                f"wafer {_pct(w.busy)} busy (target {_pct(cfg.target_utilisation)}), buffer "
                f"{w.mean_buffer_batches:.1f} of {w.buffer_capacity} batches over steps "
                f"{w.first_step}-{w.last_step}, and worker {idle[-1]} delivered nothing: the "
                f"others carry it; {_w(s.workers)} -> {s.workers - 1}", workers=(idle[-1],))
        if idle or len(w.workers) < s.workers:
            return self._hold(s, w, Phase.COOLING_DOWN if s.changed_at else s.phase,
                              f"waiting for {_w(s.workers)} to deliver (worker"
                              f"{'s' if len(idle) != 1 else ''} "
                              f"{', '.join(map(str, idle)) or 'not yet started'} delivered "
                              "nothing in the window)")
        if w.steps < cfg.window_steps:
            return self._hold(s, w, s.phase, f"a window of {w.steps} steps is shorter than "
                              f"window_steps={cfg.window_steps}")
        starving = w.busy < cfg.target_utilisation
        checked = self._check_gain(s, w) if s.added is not None else None
        if checked is not None:
            return checked
        if s.retired is not None:
            if starving and w.starved >= 0.5 * (cfg.target_utilisation - w.busy):
                s.floor = {"workers": s.retired["from"], "demand": s.retired["demand"]}
            s.retired = None
        figures = (f"wafer {_pct(w.busy)} busy (target {_pct(cfg.target_utilisation)}), "
                   f"input wait {_pct(w.starved)}, buffer {w.mean_buffer_batches:.1f} of "
                   f"{w.buffer_capacity} batches over steps {w.first_step}-{w.last_step}")
        if starving:
            return self._grow(s, w, obs, free, figures)
        return self._shrink_or_settle(s, w, figures)

    def _check_gain(self, s: CsxState, w: CsxWindow) -> Optional[Decision]:
        """After an add: did production rise? If not, the cores are the limit: retire the
        added workers and add no more."""
        a, s.added = s.added, None
        expected = (a["to"] - a["from"]) * a["rate"]
        gain = w.production - a["production"]
        if gain >= self.config.min_gain * expected or w.busy >= self.config.target_utilisation:
            return None
        s.ceiling = a["from"]
        s.phase = Phase.LIMITED
        retire = _newest(w, s.workers - a["from"])
        return Decision(
            Action.RETIRE, w.csx, w.last_step,
            f"the machine's cores are the limit: from {a['from']} to {a['to']} workers "
            f"production went {a['production']:.1f} -> {w.production:.1f} batches/s (+"
            f"{max(gain, 0):.1f}, {expected:.1f} expected); workers use "
            f"{w.cpu_per_worker:.2f} CPU each while producing. Keeping {_w(a['from'])}",
            workers=retire)

    def _grow(self, s: CsxState, w: CsxWindow, obs: Observation, free: Optional[float],
              figures: str) -> Decision:
        cfg = self.config
        if w.starved < 0.5 * (cfg.target_utilisation - w.busy):
            return self._hold(s, w, Phase.LIMITED,
                              f"{figures}: the wafer waited for the client, not for input; "
                              "more workers would not help")
        if w.mean_buffer_batches >= w.buffer_capacity - 1:
            return self._hold(s, w, Phase.SETTLED,
                              f"{figures}: this CS-X's buffer is full; another CS-X's input "
                              "holds the wafer back")
        n = s.workers
        if n >= cfg.max_workers_per_csx:
            return self._hold(s, w, Phase.LIMITED, f"{figures}: at max_workers_per_csx="
                              f"{cfg.max_workers_per_csx}; raise it, or make batches cheaper")
        if s.ceiling is not None and n >= s.ceiling:
            return self._hold(s, w, Phase.LIMITED,
                              f"{figures}: the machine's cores are the limit: more than "
                              f"{_w(s.ceiling)} did not raise production")
        r = w.rate_per_worker or 0.0
        need = math.ceil(w.demand / r) if r > 0 and math.isfinite(w.demand) else n + 1
        k = max(1, min(need - n, cfg.max_workers_per_csx - n))
        if s.ceiling is not None:
            k = min(k, s.ceiling - n)
        per = w.cpu_per_worker
        if free is not None and per > 0:
            room = int(max(free, 0.0) // per)
            if room < 1:
                return self._hold(
                    s, w, Phase.LIMITED,
                    f"{figures}: the cluster is the limit: another worker needs ~{per:.2f} CPU "
                    f"and {max(free, 0.0):.2f} of the cluster's "
                    f"{obs.cluster_cpus if obs.cluster_cpus is not None else '?'} CPUs are free")
            k = min(k, room)
        s.added = {"from": n, "to": n + k, "production": w.production, "rate": r}
        s.phase = Phase.GROWING
        return Decision(
            Action.ADD, w.csx, w.last_step,
            f"{figures}: the wafer takes {w.demand:.1f} batches/s and each worker produces "
            f"{r:.1f}/s, so {need} are needed; {_w(n)} -> {n + k}", count=k)

    def _shrink_or_settle(self, s: CsxState, w: CsxWindow, figures: str) -> Decision:
        cfg = self.config
        n = s.workers
        full = w.mean_buffer_batches >= w.buffer_capacity - 1
        r = w.rate_per_worker or 0.0
        rest = (n - 1) * r
        needed = w.demand * (1 + cfg.retire_margin)
        kept = s.floor is not None and n - 1 < s.floor["workers"] and \
            w.demand * (1 + cfg.retire_margin) >= s.floor["demand"]
        if n > cfg.min_workers_per_csx and full and rest >= needed and not kept:
            s.retired = {"from": n, "demand": w.demand}
            s.phase = Phase.SHRINKING
            return Decision(
                Action.RETIRE, w.csx, w.last_step,
                f"{figures}: the buffer stayed full and {_w(n - 1)} produce {rest:.1f} "
                f"batches/s against the wafer's {w.demand:.1f} (+{_pct(cfg.retire_margin)} "
                f"margin: {needed:.1f}); {_w(n)} -> {n - 1}", workers=_newest(w, 1))
        if s.settled_since is None:
            s.settled_since = w.first_step
        why = ""
        if kept:
            why = f"; {_w(n - 1)} starved it before"
        elif n > cfg.min_workers_per_csx and not full:
            why = "; the buffer is not full, so no worker is spare"
        elif n > cfg.min_workers_per_csx:
            why = f"; {_w(n - 1)} would produce {rest:.1f} batches/s, under {needed:.1f}"
        keep = "keeps" if n == 1 else "keep"
        return self._hold(s, w, Phase.SETTLED, f"{figures}: {_w(n)} {keep} it fed{why}")

    # -- what it settled at ------------------------------------------------------------------
    def settled(self) -> list[dict]:
        """Per CS-X: its count, phase, the step of its last change, the first step of its
        settled windows since then, and the reason of its last decision."""
        return [{"csx": c, "workers": s.workers, "phase": s.phase.value,
                 "changed_at": s.changed_at, "settled_since": s.settled_since,
                 "ceiling": s.ceiling, "reason": s.last_reason}
                for c, s in enumerate(self.csx)]

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"format": STATE_FORMAT, "config": self.config.to_dict(),
                "csx": [s.to_dict() for s in self.csx], "decisions": list(self.decisions)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`: the counts, phases and what was learnt (the
        bounds stay this run's)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"Controller.load_state_dict expects what Controller.state_dict() returned (a "
                f"dict with format {STATE_FORMAT!r}), got {type(state).__name__}.")
        if len(state["csx"]) != self.num_csx:
            raise ValueError(
                f"the autoscaling state was saved with num_csx={len(state['csx'])} and this run "
                f"has num_csx={self.num_csx}; resume with the saved num_csx.")
        self.csx = [CsxState.from_dict(d) for d in state["csx"]]
        lo, hi = self.config.min_workers_per_csx, self.config.max_workers_per_csx
        for s in self.csx:  # a new run counts its steps from 1: the old run's steps are gone
            s.workers = min(max(s.workers, lo), hi)
            s.changed_at, s.settled_since, s.added, s.retired = 0, None, None, None
        self.decisions = list(state.get("decisions", []))


# -- the observation, from the wafer's per-step records ----------------------------------------
def observe(window: list[dict], live: list[list[int]], buffer_capacity: int,
            cluster_cpus: Optional[float] = None, before: Optional[dict] = None) -> Observation:
    """The :class:`Observation` of a window from the wafer's per-step records
    (:class:`executor.wafer.loop.WaferLoop`'s ``stats``: ``compute_s``, ``input_wait_s``,
    ``wafer_t``, per CS-X ``workers``, ``buffer_occupancy_per_csx``, ``produce_start_unix``,
    ``produce_end_unix``, ``produce_cpu_s``), in step order; ``before``: the record of the
    step before the window (its end starts the window's wall time; None: the first step's
    start does). ``live``: per CS-X the local ids of its workers now.

    The free CPUs are ``cluster_cpus`` less what the window used: every worker's CPU seconds
    per second, and one core for the wafer while it computed (a simulated wafer's paced wait
    counts as computing: the figure errs towards no room).

    >>> recs = [{"step": s, "compute_s": 0.01, "input_wait_s": 0.0, "wafer_t": 0.01 * s,
    ...          "workers": [0], "buffer_occupancy_per_csx": [3.0],
    ...          "produce_start_unix": [0.0], "produce_end_unix": [0.005],
    ...          "produce_cpu_s": [0.001]} for s in range(1, 6)]
    >>> w, = observe(recs[1:], [[0]], 4, before=recs[0]).csx
    >>> (w.first_step, w.last_step, round(w.busy, 3), w.workers[0].batches)
    (2, 5, 1.0, 4)
    """
    if not window:
        raise ValueError("observe: a window needs at least one step")
    first = window[0]
    start = before["wafer_t"] if before is not None else \
        first["wafer_t"] - first["compute_s"] - first.get("input_wait_s", 0.0)
    wall = window[-1]["wafer_t"] - start
    compute = sum(r["compute_s"] for r in window)
    wait = sum(r.get("input_wait_s", 0.0) for r in window)
    windows, cpu_used = [], 0.0
    for c, ids in enumerate(live):
        per = {w: [0, 0.0, 0.0] for w in ids}
        occupancy = []
        for r in window:
            w = int(r["workers"][c])
            e = per.get(w)  # a retired worker's last batches count for nobody
            if e is not None:
                e[0] += 1
                starts, ends = r.get("produce_start_unix"), r.get("produce_end_unix")
                if starts and ends:
                    e[1] += max(ends[c] - starts[c], 0.0)
                if r.get("produce_cpu_s"):
                    e[2] += r["produce_cpu_s"][c]
            occ = r.get("buffer_occupancy_per_csx")
            occupancy.append(float(occ[c]) if occ else float(r.get("buffer_occupancy", 0.0)))
        workers = tuple(WorkerWindow(w, *per[w]) for w in ids)
        cpu_used += sum(x.cpu_s for x in workers)
        windows.append(CsxWindow(
            csx=c, first_step=int(window[0]["step"]), last_step=int(window[-1]["step"]),
            wall_s=wall, compute_s=compute, input_wait_s=wait,
            mean_buffer_batches=sum(occupancy) / len(occupancy),
            buffer_capacity=buffer_capacity, workers=workers))
    free = None
    if cluster_cpus is not None and wall > 0:
        free = cluster_cpus - cpu_used / wall - compute / wall
    return Observation(step=int(window[-1]["step"]), csx=tuple(windows),
                       cluster_cpus=cluster_cpus, free_cpus=free)
