"""Dynamic assignment: input workers take the next global batch as they become free, and the
stream puts the batches back into global order.

:class:`CoordinatedInputStream` is the input side of one CS-X (a
:class:`~workers.stream.CsxInputStream`) with a :class:`Coordinator` in front of its workers
(the stream's assignment). Under
round-robin (static) assignment step ``s`` can only come from worker ``s % W``, so one slow
batch holds the wafer while the other workers sit with full buffers. Here:

- the coordinator hands out *global batch numbers* (the wafer step that consumes the batch:
  global batch ``s % n`` of epoch ``s // n``) in increasing order to whichever worker has room,
  each worker holding at most ``assigned_batches_per_worker`` numbers it has not delivered;
- a worker's :class:`~workers.sharding.ShardedSampler` (or
  :class:`~workers.sharding.ParquetDataset`) turns each number into its samples (this CS-X's
  slice of that global batch), so which worker produces a batch changes, the batch does not;
- replies from any worker land in a bounded *reorder window* keyed by number, and
  the stream's ``next`` releases them in order: the wafer sees exactly the single-process
  sequence;
- numbers are issued only below ``delivered + reorder_window_batches`` (and while the window's
  bytes stay under the CS-X's byte bound), so memory stays bounded whatever a straggler does;
- a loader that draws index batches ahead of the batch it yields (a torch ``DataLoader`` with
  worker processes draws ``prefetch_factor * num_workers``; a prefetching sampler wrapper its
  own read-ahead) needs that many numbers beyond the one it produces before it yields it. Each
  worker is granted its loader's look-ahead ``L`` on top of its share (known from the loader,
  :func:`workers.sharding.draws_ahead`, or learnt when the worker reports that its loader
  waits for a number with ``L`` batches drawn and not produced), the reorder window grows by
  the workers' look-aheads, and the worker holding the oldest number not yet received is
  always topped up to ``L + 1`` numbers, past the window's bound if need be: that batch can
  always be produced, so the stream never waits for a batch that waits for numbers. The
  numbers a loader draws ahead are still its own, taken in increasing order, and its
  sampler's position counts only the batches the loader yielded: order, exactly-once and
  resume are those of a loader that draws nothing ahead;
- a worker whose process dies is restarted from the position after the last batch received
  from it (on another node where there is one, :mod:`workers.placement`); the numbers it
  had not delivered go to the live workers that can make them at once (each keeps the last
  global batches it walked past, :data:`~workers.sharding.PASSED_BATCHES`), the rest to the
  new process, in order; the new process gets new numbers once it answers: nothing is lost or
  repeated, and the wafer does not wait for a process to start;
- the resume position is the position after the last delivered batch (global-batch units,
  :mod:`workers.resume`'s one format), the same for every worker: it resumes with any number
  of workers, in either mode.

Loaders that cannot take part (iterable datasets, other samplers:
:func:`workers.sharding.dynamic_assignment_support`) keep the round-robin
(:class:`~workers.stream.RoundRobin`); the stream's ``stats`` say which mode ran and why.
"""

from __future__ import annotations

import collections
import copy
import random
import threading
import time
from collections import deque
from typing import Any

import ray

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint
from workers.duplicates import WorkerKeys
from workers.flow import FlowPolicy
from workers.resume import start_position
from workers.sharding import PASSED_BATCHES
from workers.stream import CsxInputStream, RoundRobin, StreamWorker

__all__ = ["CoordinatedInputStream", "cost_summary", "global_position"]

_COST_SAMPLES = 4096  # batch costs kept per worker (a uniform sample of all of them)
_PUMP_WAIT_S = 0.02  # the pump's longest wait for replies before it looks for new work
_HELD_WORK_S = 0.005
"""Dynamic assignment: cheap batches are assigned to a worker this much work at a time (by
the median of its recent batch costs), so that one call and one reply serve many batches."""
_REFILL_FRACTION = 8  # a full reorder window is refilled once this fraction of it is free
_COST_SAMPLES_FOR_SIZING = 8  # batch costs seen before the assignment size follows them
_RECENT_COSTS = 64  # the assignment size follows the median of this many recent batch costs


def global_position(states: list) -> dict | None:
    """The ``after`` dict of the furthest position among resume ``states`` when their loaders
    keep positions in global-batch units (``ShardedSampler``, ``ParquetDataset``:
    ``loader_state`` has ``next_global_batch``), else None. Under round-robin the furthest
    worker delivered the step just before the resume step, so its position is where every
    worker resumes."""
    best = None
    for st in states:
        usd = st.user_state_dict or {}
        ls = usd.get("loader_state")
        if not (isinstance(ls, dict) and "next_global_batch" in ls):
            return None
        key = (int(usd.get("epoch", 0)), int(ls.get("epoch", 0)), int(ls["next_global_batch"]))
        if best is None or key > best[0]:
            best = (key, st)
    if best is None:
        return None
    st = best[1]
    return {"worker_step": int(st.worker_step), "samples_streamed": int(st.samples_streamed),
            "user_state_dict": copy.deepcopy(st.user_state_dict)}


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


class CoordinatedInputStream(CsxInputStream):
    """A :class:`~workers.stream.CsxInputStream` given a :class:`Coordinator` as its
    assignment: its global batches are assigned to the workers by the coordinator
    (``CSConfig.input_assignment="dynamic"``) or round-robin (``"static"``), recording either
    way what the run report needs about stragglers. Takes the stream's arguments."""

    def __init__(self, dataloader, cs_config, wse_id, *, resume_states=None, **options):
        super().__init__(dataloader, cs_config, wse_id, resume_states=resume_states,
                         assignment=Coordinator(resume_states), **options)

    @property
    def window_batches(self) -> int:
        """The reorder window's bound in batches (:attr:`Coordinator.window_batches`)."""
        return self.assignment.window_batches

    @property
    def assigned_per_worker(self) -> int:
        """Numbers a worker holds at most where its batches are not cheap
        (:attr:`Coordinator.assigned_per_worker`)."""
        return self.assignment.assigned_per_worker


class Coordinator:
    """The assignment of a :class:`~workers.stream.CsxInputStream` whose global batches are
    handed out by a coordinator (``CSConfig.input_assignment="dynamic"``), or round-robin
    (``"static"``, or loaders that cannot take part) through a
    :class:`~workers.stream.RoundRobin`; either way it records what the run report needs about
    stragglers: each worker's batch costs, the reorder window's occupancy and the wait
    attributable to stragglers.

    The policy's ``assigned_batches_per_worker`` bounds the numbers a worker holds (the one it
    produces and the ones queued behind it), and its
    :meth:`~workers.flow.FlowPolicy.reorder_window_batches` the numbers issued beyond the last
    delivered step (None: ``num_workers_per_csx`` x the stream's ``max_batches_ahead``, what
    the workers' buffers hold together under round-robin: the same bound on memory).

    The wait attributable to stragglers is the time the stream's ``next`` waited for a step
    while later batches were already there: in the reorder window (dynamic, from the moment
    the first one arrived), or with another worker (static, when the wait began). The data was
    there, in the wrong worker. It is counted against the worker that produced the step.
    """

    stream: CsxInputStream
    cs_config: CSConfig
    policy: FlowPolicy

    def __init__(self, resume_states=None):
        """``resume_states``: those the stream is given; under dynamic assignment every worker
        starts from the furthest position among them (:func:`global_position`)."""
        self._resume_states = resume_states
        self.round_robin = RoundRobin()

    def attach(self, stream: CsxInputStream) -> None:
        self.stream = stream
        self.round_robin.attach(stream)
        self.cs_config, self.policy = stream.cs_config, stream.policy
        W = self.num_workers = stream.num_workers
        resume_states = self._resume_states
        self.requested_mode = self.cs_config.input_assignment
        self.mode = "static"
        self.mode_reason = ""
        self.assigned_per_worker = self.policy.assigned_batches_per_worker
        self.window_batches = W * self.assigned_per_worker  # sized once the workers start
        self._base_window = self.window_batches
        self._dynamic_start = None
        if resume_states is not None and self.requested_mode == "dynamic":
            states = [DataLoaderCheckpoint(**s) if isinstance(s, dict) else s
                      for s in resume_states]
            self._dynamic_start = global_position(states)
        self._init_numbers(W)
        self._init_records(W)
        self._cond = threading.Condition()  # guards everything the pump thread touches
        self._pump_thread: threading.Thread | None = None
        self._pump_error: BaseException | None = None

    def _init_numbers(self, W: int) -> None:
        """The state of the numbers handed out and of the reorder window."""
        self._outstanding = [deque() for _ in range(W)]  # numbers assigned, not yet received
        self._sends = [0] * W  # assign() calls made to each worker's current actor
        self._window: dict[int, tuple[int, dict]] = {}  # number -> (worker, reply item)
        self._window_bytes = 0
        self._next_number = 0
        self._first_issued = 0
        self._refilling = False  # the window was filled to its bound: refilled in chunks
        self._refill_free = 1  # numbers free in a refilling window when the pump refills it
        self._delivered_after: dict | None = None
        self._failed = [False] * W  # a worker's error reply is in the window
        self._draws_ahead = [0] * W  # index batches each worker's loader draws ahead
        # each worker's current process: the first and the highest number assigned to it
        self._first_number: list[int | None] = [None] * W
        self._last_number: list[int | None] = [None] * W
        self._starting = [False] * W  # a restarted process that has not answered yet
        self._batches_per_epoch: int | None = None  # global batches of an epoch (dynamic)

    def _init_records(self, W: int) -> None:
        """What the run report reads: batch costs, straggler waits, window occupancy, CPU."""
        self._costs = [[] for _ in range(W)]
        # each worker's recent batch costs: their median sizes its assignment (a mean would
        # follow the moments a loaded machine preempted the worker, not its batches' work)
        self._recent_costs = [collections.deque(maxlen=_RECENT_COSTS) for _ in range(W)]
        self._cost_seen = [0] * W
        self._cost_rng = [random.Random(w) for w in range(W)]
        self._straggler_wait = [0.0] * W
        self._idle_s = [0.0] * W  # each worker's time waiting for its next number
        self._occupancy_sum = 0
        self._occupancy_max = 0
        self._deliveries = 0
        self._pump_cpu_s = 0.0  # the coordinator thread's CPU time
        self._issue_cpu_s = 0.0  # its CPU time choosing workers for numbers and sending them

    # -- setup ----------------------------------------------------------------------------
    def begin(self) -> None:
        """Size the window now that the stream's buffers are known, and decide the mode."""
        # None: what the workers hold together under round-robin; never less than every
        # worker's share, so the window never starves a worker outright
        W = self.num_workers
        window = self.policy.reorder_window_batches(W) or W * self.stream.max_batches_ahead
        self._base_window = max(window, W * self.assigned_per_worker)
        self.window_batches = self._base_window
        self._decide_mode()

    def spawn_options(self, wk: StreamWorker) -> dict:
        if self.requested_mode != "dynamic":
            return {}
        start = self._dynamic_start if wk.restarts == 0 and self.mode == "static" else None
        return {"dynamic": True,
                "dynamic_start": None if start is None else
                start.get("user_state_dict") or start_position()}

    def started(self, wk: StreamWorker, actor) -> dict:
        w = wk.info.local_worker_id
        self._sends[w] = 0
        if self.mode != "dynamic":
            return {}
        # a restart. The numbers the dead process did not deliver (those of replies received
        # and not yet moved into the window are delivered) go to live workers that can make
        # them now; the new process makes the rest, in order, and gets new numbers once it
        # answers (a process starts in seconds: numbers given to it would wait as long)
        self._first_number[w] = self._last_number[w] = None
        self._starting[w] = True
        received = sum(1 for it in wk.ready if it["kind"] != "error")
        out = list(self._outstanding[w])
        kept = self._hand_over(w, out[received:])
        self._outstanding[w] = deque(out[:received] + kept)
        if kept:
            actor.assign.remote(0, kept)
            self._sends[w] = 1
            self._first_number[w], self._last_number[w] = kept[0], kept[-1]
        return {"numbers_owed": len(out) - received,
                "handed_to_live_workers": len(out) - received - len(kept)}

    def _can_take(self, w: int, number: int) -> bool:
        """Whether live worker ``w`` can make ``number`` next after what it holds: its
        process started before that number (it walks the epoch from a position at or before
        its first number), the number is in the epoch of its highest one, and is among the
        last :data:`PASSED_BATCHES` it walked past or ahead of it."""
        first, last, n = self._first_number[w], self._last_number[w], self._batches_per_epoch
        return (not self._starting[w] and first is not None and n is not None
                and first < number and number // n == last // n
                and last - number < PASSED_BATCHES)

    def _hand_over(self, dead: int, numbers: list) -> list:
        """Give each of ``numbers`` (those worker ``dead`` owed, in order) to the live worker
        holding the fewest that can make it (:meth:`_can_take`), one on a node where no worker
        just died if there is one; returns those none can take."""
        suspects = set(self.stream.placer.suspects())
        given: dict[int, list[int]] = {}
        kept = []
        for number in numbers:
            able = [w for w in range(self.num_workers)
                    if w != dead and self._can_take(w, number)]
            healthy = [w for w in able if (self.stream.workers[w].node or {}).get("node_id")
                       not in suspects]
            if not able:
                kept.append(number)
                continue
            w = min(healthy or able, key=lambda i: len(self._outstanding[i]))
            self._outstanding[w].append(number)
            given.setdefault(w, []).append(number)
        for w, nums in given.items():
            wk = self.stream.workers[w]
            sent = (self._sends[w], nums)
            if wk.pending or not self.stream.top_up(wk, assign=sent):
                wk.actor.assign.remote(*sent)
            self._sends[w] += 1
        return kept

    def waits_after_restart(self) -> bool:
        # dynamic: the pump goes back to every worker's replies (the numbers the dead one
        # owed may now be with the others)
        return self.mode != "dynamic"

    def _check_started(self) -> None:
        """A restarted process that answered ``where()`` takes new numbers from now on."""
        for w, wk in enumerate(self.stream.workers):
            if self._starting[w]:
                self.stream.node_of(wk, 0)
                self._starting[w] = wk.where_ref is not None

    def _decide_mode(self) -> None:
        if self.requested_mode == "static":
            self.mode, self.mode_reason = "static", "CSConfig.input_assignment='static'"
            return
        modes = []
        for wk in self.stream.workers:
            try:
                mode, why, ahead = ray.get(wk.actor.assignment_mode.remote())
            except ray.exceptions.RayError:
                mode, why, ahead = "failed", "", 0  # fetch reports what went wrong
            modes.append((mode, why))
            self._draws_ahead[wk.info.local_worker_id] = ahead
        kinds = {m for m, _ in modes if m != "failed"}
        if kinds == {"dynamic"}:
            self.mode, self.mode_reason = "dynamic", modes[0][1]
            self._size_window()
        else:
            # a failed build is reported by the first fetch; round-robin then raises it
            self.mode = "static"
            self.mode_reason = next((why for m, why in modes if m == "static"),
                                    "the input workers could not build their dataloaders")
            if "dynamic" in kinds:  # the stream closes itself as it raises
                raise RuntimeError(
                    f"CS-X {self.stream.wse_id}: the input workers' loaders disagree on dynamic "
                    f"assignment ({[m for m, _ in modes]}); input_fn must build the same kind "
                    "of loader in every worker.")
            return
        self._next_number = self._first_issued = self.stream.step
        try:
            self._batches_per_epoch = ray.get(
                self.stream.workers[0].actor.batches_per_epoch.remote(), timeout=60)
        except ray.exceptions.RayError:
            pass  # None: a dead worker's numbers wait for its new process
        if self._dynamic_start is not None:
            for wk in self.stream.workers:  # a restart before any batch starts here too
                wk.received_after = wk.consumed_after = self._dynamic_start
        with self._cond:
            self._issue()
        pump = threading.Thread(target=self._pump, daemon=True,
                                name=f"coordinator-csx{self.stream.wse_id}")
        pump.start()
        self._pump_thread = pump  # close() joins only a started thread, even after a Ctrl-C

    # -- the coordinator --------------------------------------------------------------------
    def _size_window(self) -> None:
        """The reorder window: its base size plus every worker's look-ahead, so that the
        workers can hold their share and the numbers their loaders draw ahead together."""
        self.window_batches = self._base_window + sum(self._draws_ahead)

    def needs_numbers(self, wk: StreamWorker, drawn_ahead: int) -> None:
        """``wk``'s loader waits for a number with ``drawn_ahead`` batches drawn and not yet
        produced: it draws at least that many ahead (a sampler wrapper's read-ahead)."""
        w = wk.info.local_worker_id
        if drawn_ahead > self._draws_ahead[w]:
            self._draws_ahead[w] = drawn_ahead
            self._size_window()

    def numbers_per_worker(self, w: int) -> int:
        """Numbers worker ``w`` may hold now: ``assigned_per_worker``, or, where its batches
        are so cheap that it makes more than that in ``_HELD_WORK_S``, as many as it makes in
        that time (by its own median batch cost; at most the policy's ``small_reply_batches``
        and its share of the reorder window).
        A slow batch then holds back at most that much of its worker's usual work, and cheap
        batches go many to a call."""
        k = self.assigned_per_worker
        cap = min(self.policy.small_reply_batches,
                  self.window_batches // self.num_workers)  # the workers share the window
        recent = self._recent_costs[w]
        if len(recent) < _COST_SAMPLES_FOR_SIZING or cap <= k:
            return k
        typical = sorted(recent)[len(recent) // 2]
        return max(k, min(cap, int(_HELD_WORK_S / max(typical, 1e-9))))

    def reply_min_batches(self, wk: StreamWorker) -> int:
        """Dynamic assignment of cheap batches (more numbers held than
        ``assigned_per_worker``): a fetch waits for every number the worker holds (at most a
        reply's worth, and at most ``input_worker._REPLY_WAIT_S``), so one reply carries
        them all. Costly batches: 1, never delayed."""
        w = wk.info.local_worker_id
        if self.mode != "dynamic" or self.numbers_per_worker(w) <= self.assigned_per_worker:
            return 1
        held = len(self._outstanding[w]) - sum(1 for it in wk.ready if it["kind"] != "error")
        # the last numbers held are drawn ahead: their batches wait for numbers not yet given
        held -= self._draws_ahead[w]
        return max(1, min(held, self.stream.batches_per_fetch))

    def _window_full(self) -> bool:
        if self._next_number >= self.stream.step + self.window_batches:
            return True
        limit = self.stream.in_flight_bytes_per_worker
        return limit is not None and self._window and \
            self._window_bytes >= limit * self.num_workers

    def _refill_due(self, step: int) -> bool:
        """Whether the window, once ``step`` is the next to deliver, takes new numbers: it is
        not refilling, or a refill's worth of it is free."""
        return not self._refilling or \
            step + self.window_batches - self._next_number >= self._refill_free

    def _issue(self) -> None:
        """Give the next numbers to the workers with room, fewest held first. A full window
        is refilled once an eighth of it is free, and at least as many numbers as the workers
        may hold together (a full reply each where batches are cheap; at most half the
        window), not a number at a time: with input faster than the wafer it is full nearly
        always, and one number a step would cost one ``assign`` call and one reply a step."""
        k = [self.numbers_per_worker(w) + self._draws_ahead[w] for w in range(self.num_workers)]
        refill = max(1, self.window_batches // _REFILL_FRACTION,
                     min(sum(k), self.window_batches // 2))
        self._refill_free = refill
        new: dict[int, list[int]] = {}
        if self._refill_due(self.stream.step):
            self._refilling = False
            while not self._window_full():
                free = [w for w in range(self.num_workers)
                        if len(self._outstanding[w]) < k[w] and not self._starting[w]]
                if not free:
                    break
                w = min(free, key=lambda i: len(self._outstanding[i]))
                self._give(w, new)
            self._refilling = self._next_number >= self.stream.step + self.window_batches
        self._top_up_oldest(new)
        for w, numbers in new.items():
            wk = self.stream.workers[w]
            # a worker with no request out gets one carrying its numbers: one call, not two
            sent = (self._sends[w], numbers)
            if wk.pending or not self.stream.top_up(wk, assign=sent):
                wk.actor.assign.remote(*sent)
            self._sends[w] += 1

    def _give(self, w: int, new: dict) -> None:
        """Assign the next number to worker ``w`` (sent with ``new``'s numbers)."""
        self._outstanding[w].append(self._next_number)
        if self._first_number[w] is None:
            self._first_number[w] = self._next_number
        self._last_number[w] = self._next_number
        new.setdefault(w, []).append(self._next_number)
        self._next_number += 1

    def _top_up_oldest(self, new: dict) -> None:
        """The worker holding the oldest number not yet received gets numbers until it holds
        its look-ahead and one, whatever the window's bounds: its loader yields that batch
        only once it has drawn that many, and every later step waits for that batch. At most
        the look-ahead beyond the window's bound; nothing where loaders draw nothing ahead."""
        heads = [(out[0], w) for w, out in enumerate(self._outstanding)
                 if out and not self._failed[w]]
        if not heads:
            return
        w = min(heads)[1]
        while len(self._outstanding[w]) < self._draws_ahead[w] + 1:
            self._give(w, new)

    def global_batch(self, wk: StreamWorker, reply: dict) -> int | None:
        """The global batch a worker's failed ``reply`` was for: under dynamic assignment the
        number the worker was producing (not the round-robin formula's)."""
        if self.mode != "dynamic":
            return self.round_robin.global_batch(wk, reply)
        if "global_batch" in reply:
            return reply["global_batch"]
        index, w = reply.get("index"), wk.info.local_worker_id
        undrained = sum(1 for it in wk.ready if it["kind"] != "error")
        pos = None if index is None else index - (wk.received - undrained)
        out = self._outstanding[w]
        return out[pos] if pos is not None and 0 <= pos < len(out) else None

    def _drain(self, wk: StreamWorker) -> None:
        """Move ``wk``'s received replies into the reorder window."""
        w = wk.info.local_worker_id
        while wk.ready:
            item = wk.ready.popleft()
            if item["kind"] == "error":
                # the batch the worker was making: its oldest number not received
                number = self._outstanding[w][0] if self._outstanding[w] else self.stream.step
                item["global_batch"] = number
                self._window.setdefault(number, (w, item))
                self._failed[w] = True
                continue
            wk.ready_bytes -= item["nbytes"]
            number = item["step"]
            expected = self._outstanding[w].popleft() if self._outstanding[w] else None
            if number != expected:  # a broken invariant, never silently wrong data
                self.stream.raise_failure(wk, {
                    "exc_type": "RuntimeError", "traceback": "", "during": "in transport",
                    "exc_message": f"expected global batch {expected}, received {number}"})
            self._window[number] = (w, item)
            self._window_bytes += item["nbytes"]
            self._record_cost(w, item.get("produce_s"))
            self._idle_s[w] += item.get("idle_s", 0.0)

    def _record_cost(self, w: int, cost) -> None:
        if cost is None:
            return
        self._cost_seen[w] += 1
        self._recent_costs[w].append(cost)
        costs = self._costs[w]
        if len(costs) < _COST_SAMPLES:
            costs.append(cost)
        else:
            j = self._cost_rng[w].randrange(self._cost_seen[w])
            if j < _COST_SAMPLES:
                costs[j] = cost

    def _others_ahead(self, w: int) -> bool:
        """Round-robin: another worker than ``w`` has a later batch here or on its way."""
        if any(wk.ready for i, wk in enumerate(self.stream.workers) if i != w):
            return True
        refs = [wk.pending[0][1] for i, wk in enumerate(self.stream.workers) if i != w and wk.pending]
        if not refs:
            return False
        done, _ = ray.wait(refs, num_returns=1, timeout=0, fetch_local=False)
        return bool(done)

    def _holder(self, number: int) -> int | None:
        return next((w for w, out in enumerate(self._outstanding) if number in out), None)

    def _pump(self) -> None:
        """The coordinator's thread (dynamic mode): take in every worker's replies as they
        come and hand out numbers, whether or not the wafer's feeder is asking for a batch
        (it asks once a step while the wafer's input buffer is full), so a worker is never
        left waiting for its next number."""
        cpu0 = time.thread_time()
        try:
            while not self.stream.closed:
                self._pump_cpu_s = time.thread_time() - cpu0
                with self._cond:
                    self._check_started()
                    t0 = time.thread_time()
                    self._issue()
                    self._issue_cpu_s += time.thread_time() - t0
                    by_ref = {}
                    for wk in self.stream.workers:
                        if self._outstanding[wk.info.local_worker_id] and not wk.pending \
                                and not wk.ready:
                            self.stream.top_up(wk)
                        if wk.ready:
                            self._drain(wk)
                        if self._outstanding[wk.info.local_worker_id] and wk.pending:
                            by_ref[wk.pending[0][1]] = wk
                    self._cond.notify_all()
                    if not by_ref:
                        # no worker holds a number (the window is full, or waits to be
                        # refilled): next() wakes this thread when it moves the window on
                        self._cond.wait(_PUMP_WAIT_S)
                        continue
                done, _ = ray.wait(list(by_ref), num_returns=1,
                                   timeout=_PUMP_WAIT_S, fetch_local=False)
                if not done:
                    continue
                with self._cond:
                    for ref in done:
                        wk = by_ref[ref]
                        if wk.pending and wk.pending[0][1] is ref:
                            self.stream.receive_reply(wk)  # it is there; restarts a dead worker
                            self._drain(wk)
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 (raised by next() in the consumer's thread)
            with self._cond:
                if not self.stream.closed or self._pump_error is None:
                    self._pump_error = e
                self._cond.notify_all()

    def _wait_for(self, number: int) -> float:
        """Wait (the caller holds ``_cond``) until ``number`` is in the window; returns how
        long of that wait later batches were already in the window (straggler wait)."""
        timeout = self.cs_config.straggler_timeout_s
        wait_start = time.perf_counter()
        next_report = timeout
        ahead_since = None
        while number not in self._window:
            if self._pump_error is not None:
                raise self._pump_error
            self.stream.check_open()
            if ahead_since is None and any(n > number for n in self._window):
                ahead_since = time.perf_counter()
            self._cond.wait(self.stream.poll_s)
            waited = time.perf_counter() - wait_start
            holder = self._holder(number)
            if waited >= next_report and holder is not None and number not in self._window:
                self._cond.release()
                try:
                    self.stream.report_straggler(self.stream.workers[holder], waited)
                finally:
                    self._cond.acquire()
                next_report = max(2 * next_report, waited + timeout)
        return 0.0 if ahead_since is None else time.perf_counter() - ahead_since

    def stall_report(self) -> list[dict]:
        """Dynamic assignment: every worker holding numbers not yet received, the holder of
        the next step's number first; while the duplicate check waits for the workers' first
        batches, those it waits for (see :meth:`RoundRobin.stall_report`)."""
        if self.mode == "static":
            return self.round_robin.stall_report()
        with self._cond:
            number = self.stream.step
            keys_wait = self.stream.peeked is not None
            owing = []
            for wk in self.stream.workers:
                if keys_wait and wk.received >= wk.keys_until:
                    continue
                received = sum(1 for it in wk.ready if it["kind"] != "error")
                numbers = list(self._outstanding[wk.info.local_worker_id])[received:]
                if numbers:
                    owing.append((wk, numbers))
        owing.sort(key=lambda o: number not in o[1])
        owed = self.stream.with_stacks(owing)
        if not keys_wait and not any(number in o[1] for o in owing):  # a broken invariant
            owed.insert(0, {"wse_id": self.stream.wse_id, "local_worker_id": None,
                            "batches": [(number, number - self.stream.first_step + 1)],
                            "note": "(no input worker holds this global batch: the coordinator "
                                    "has not assigned it)"})
        return owed

    # -- delivering -------------------------------------------------------------------------
    def next_reply(self) -> tuple[int, dict, Any]:
        step = self.stream.step
        t0 = time.perf_counter()
        if self.mode == "static":
            w = step % self.num_workers
            ahead = not self.stream.workers[w].ready and self._others_ahead(w)
            w, reply, batch = self.round_robin.next_reply()
            if ahead:
                self._straggler_wait[w] += time.perf_counter() - t0
            self._record_cost(w, reply.get("produce_s"))
            self._delivered_after = reply["after"]
            return w, reply, batch
        with self._cond:
            if step not in self._window:
                straggling = self._wait_for(step)
                self._straggler_wait[self._window[step][0]] += straggling
            w, item = self._window.pop(step)
            wk = self.stream.workers[w]
            self._occupancy_sum += len(self._window)
            self._occupancy_max = max(self._occupancy_max, len(self._window))
            self._deliveries += 1
            if item["kind"] != "error":
                self._window_bytes -= item["nbytes"]
                self._delivered_after = item["after"]
                # the window moved on: the pump hands the freed numbers to workers with room,
                # off this (the wafer feeder's) thread; a refilling window, once a refill's
                # worth is free (woken every step, the pump would take the GIL from the
                # wafer every step for nothing)
                if self._refill_due(step + 1):
                    self._cond.notify_all()
        if item["kind"] == "error":
            self.stream.raise_failure(wk, item)
        return w, item, item.pop("batch")

    def sample_keys(self) -> list[WorkerKeys]:
        if self.mode == "static":
            return self.round_robin.sample_keys()
        with self._cond:
            # the pump takes in the replies (and their keys); every worker holds numbers
            # from the start, so each gets its first batches
            while not all(wk.received >= wk.keys_until or self._failed[wk.info.local_worker_id]
                          for wk in self.stream.workers):
                if self._pump_error is not None:
                    raise self._pump_error
                self.stream.check_open()
                self._cond.wait(self.stream.poll_s)
            return [WorkerKeys(self.stream.wse_id, wk.info.local_worker_id, list(wk.keys))
                    for wk in self.stream.workers]

    def worker_states(self) -> list[DataLoaderCheckpoint]:
        if self.mode == "static":
            return self.round_robin.worker_states()
        with self._cond:
            return self._dynamic_states()

    def _dynamic_states(self) -> list[DataLoaderCheckpoint]:
        # every worker resumes at the position after the last delivered batch; worker_step
        # values are a round-robin position, so the states resume in either mode
        after = self._delivered_after or self._dynamic_start
        W, total = self.num_workers, self.stream.step
        out = []
        for wk in self.stream.workers:
            i = wk.info
            a = after or wk.consumed_after
            out.append(DataLoaderCheckpoint(
                local_worker_id=i.local_worker_id, num_workers_per_csx=W, num_csx=i.num_csx,
                wse_id=i.wse_id, appliance_step=total,
                worker_step=(total - i.local_worker_id + W - 1) // W,
                samples_streamed=int(a.get("samples_streamed", 0)),
                user_state_dict=copy.deepcopy(a.get("user_state_dict") or start_position())))
        return out

    def ready_count(self) -> int:
        if self.mode == "static":
            return self.round_robin.ready_count()
        with self._cond:
            return len(self._window)

    def close(self) -> None:
        """Wake the pump thread (the stream is closed) and wait for it to end."""
        pump = self._pump_thread
        if pump is not None and pump is not threading.current_thread():
            with self._cond:
                self._cond.notify_all()
            pump.join(timeout=5)

    def stats(self) -> dict:
        if self.mode == "dynamic":
            with self._cond:
                return self._stats()
        return self._stats()

    def _stats(self) -> dict:
        out = self.stream.transport_stats()
        out["assignment"] = {
            "requested": self.requested_mode, "mode": self.mode, "reason": self.mode_reason,
            "assigned_batches_per_worker": [self.numbers_per_worker(w) for w in range(
                self.num_workers)] if self.mode == "dynamic" else None,
            "reorder_window_batches": self.window_batches if self.mode == "dynamic" else None,
            "draws_ahead": list(self._draws_ahead) if self.mode == "dynamic" else None,
        }
        if self.mode == "dynamic":
            out["coordinator"] = {
                "numbers_assigned": self._next_number - self._first_issued,
                "thread_cpu_s": self._pump_cpu_s, "issuing_cpu_s": self._issue_cpu_s}
            out["reorder_window"] = {
                "max_batches": self._occupancy_max,
                "mean_batches": self._occupancy_sum / self._deliveries if self._deliveries
                else 0.0,
                "capacity_batches": self.window_batches}
        out["straggler_wait_s"] = sum(self._straggler_wait)
        for entry in out["workers"]:
            w = entry["local_worker_id"]
            entry["batch_cost"] = cost_summary(self._costs[w])
            entry["straggler_wait_s"] = self._straggler_wait[w]
            if self.mode == "dynamic":
                entry["waiting_for_numbers_s"] = self._idle_s[w]
                entry["draws_ahead"] = self._draws_ahead[w]
        return out
