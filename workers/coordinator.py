"""Dynamic assignment: input workers take the next global batch as they become free, and the
stream puts the batches back into global order.

:class:`DynamicAssignment` is the assignment (:mod:`workers.assignment`) a stream is given
when ``CSConfig.input_assignment="dynamic"`` and its workers' loaders take part;
:class:`NumberBook` keeps which worker holds which numbers. Under
round-robin (static) assignment step ``s`` can only come from worker ``s % W``, so one slow
batch holds the wafer while the other workers sit with full buffers. Here:

- the coordinator hands out *global batch numbers* (the wafer step that consumes the batch:
  global batch ``s % n`` of epoch ``s // n``) in increasing order to whichever worker has room,
  each worker holding at most ``assigned_batches_per_worker`` numbers it has not delivered;
- a worker's :class:`~workers.sharding.ShardedSampler` (or
  :class:`~workers.parquet.ParquetDataset`) turns each number into its samples (this CS-X's
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
  :func:`workers.loaders.draws_ahead`, or learnt when the worker reports that its loader
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
:func:`workers.loaders.dynamic_assignment_support`) keep the round-robin
(:class:`~workers.assignment.RoundRobin`); the stream's ``stats`` say which mode ran and why.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Optional

import ray

from workers.assignment import (Assignment, AssignmentRecorder, StreamParts, WorkerPool,
                                dynamic_resume_states)
from workers.context import DataLoaderCheckpoint
from workers.link import WorkerFailed, WorkerLink
from workers.replies import WorkerReply
from workers.positions import WorkerPosition
from workers.sharding import PASSED_BATCHES

__all__ = ["DynamicAssignment", "NumberBook"]

_PUMP_WAIT_S = 0.02  # the pump's longest wait for replies before it looks for new work
_HELD_WORK_S = 0.005
"""Dynamic assignment: cheap batches are assigned to a worker this much work at a time (by
the median of its recent batch costs), so that one call and one reply serve many batches."""
_REFILL_FRACTION = 8  # a full reorder window is refilled once this fraction of it is free
_COST_SAMPLES_FOR_SIZING = 8  # batch costs seen before the assignment size follows them


class NumberBook:
    """Which worker holds which global batch numbers: handed out in increasing order, each
    worker holding at most :meth:`numbers_per_worker` plus its loader's look-ahead, and sent to
    the workers through their links. It keeps every per-worker fact of the assignment (the
    numbers held, the look-ahead, the reply size, a process starting, a worker leaving), and
    says how many batches each link's next reply waits for (:meth:`min_batches`)."""

    def __init__(self, parts: StreamParts, recorder: AssignmentRecorder, draws_ahead: list):
        self.parts, self.recorder = parts, recorder
        self.assigned_per_worker = parts.setup.policy.assigned_batches_per_worker
        self.outstanding: list[collections.deque] = []  # numbers assigned, not yet received
        self.draws_ahead: list[int] = []
        """The index batches each worker's loader draws ahead of the one it yields (known from
        the loader, or learnt from a ``need_numbers`` reply)."""
        self.many_per_reply: list[bool] = []
        """Cheap batches: a fetch waits for every number the worker holds
        (:meth:`min_batches`), as the worker's batch costs say."""
        self.sends: list[int] = []  # assign() calls made to each worker's current actor
        self.failed: list[bool] = []  # a worker's error reply is in the window
        # each worker's current process: the first and the highest number assigned to it
        self.first_number: list[Optional[int]] = []
        self.last_number: list[Optional[int]] = []
        self.starting: list[bool] = []  # a process that has not answered yet
        self.leaving: set[int] = set()  # retired: gets no new numbers, hands back or finishes
        for ahead in draws_ahead:
            self.add_worker(ahead, starting=False)
        self.next_number = self.first_issued = parts.position()
        self.batches_per_epoch: Optional[int] = None  # global batches of an epoch
        self.base_window = 0  # the reorder window's bound before the look-aheads

    def add_worker(self, draws_ahead: int, starting: bool) -> None:
        """One more worker (the next local id), ``starting``: its process has not answered."""
        self.outstanding.append(collections.deque())
        self.draws_ahead.append(int(draws_ahead))
        self.many_per_reply.append(False)
        self.sends.append(0)
        self.failed.append(False)
        self.first_number.append(None)
        self.last_number.append(None)
        self.starting.append(starting)

    @property
    def num_workers(self) -> int:
        """The workers ever given numbers by this book (retired ones included)."""
        return len(self.outstanding)

    def takes_part(self, w: int) -> bool:
        """Whether worker ``w`` may be given new numbers: it has not been retired."""
        return w not in self.leaving and not self.parts.links[w].retired

    @property
    def window_batches(self) -> int:
        """The reorder window: its base size plus every worker's look-ahead, so that the
        workers can hold their share and the numbers their loaders draw ahead together."""
        return self.base_window + sum(a for w, a in enumerate(self.draws_ahead)
                                      if not self.parts.links[w].retired)

    def note_costs(self, link: WorkerLink) -> None:
        """Whether ``link``'s worker now gets many numbers per reply (its batches are cheap)."""
        self.many_per_reply[link.w] = self.numbers_per_worker(link.w) > self.assigned_per_worker

    # -- the sizes of the links' replies -------------------------------------------------
    def min_batches(self, link: WorkerLink) -> int:
        """The batches a multi-batch fetch waits for: 1, never delaying a batch that is ready;
        where the worker's batches are cheap, every number it holds (at most a reply's worth,
        and at most ``workers.input_worker._REPLY_WAIT_S``), so one reply carries them all."""
        w = link.w
        if not self.many_per_reply[w]:
            return 1
        held = len(self.outstanding[w]) - link.received_waiting()
        # the last numbers held are drawn ahead: their batches wait for numbers not yet given
        held -= self.draws_ahead[w]
        return max(1, min(held, self.parts.setup.batches_per_fetch))

    def drawn_ahead(self, link: WorkerLink, count: int) -> None:
        self.draws_ahead[link.w] = max(self.draws_ahead[link.w], int(count))

    def numbers_per_worker(self, w: int) -> int:
        """Numbers worker ``w`` may hold now: ``assigned_per_worker``, or, where its batches
        are so cheap that it makes more than that in ``_HELD_WORK_S``, as many as it makes in
        that time (by its own median batch cost; at most the policy's ``small_reply_batches``
        and its share of the reorder window). A slow batch then holds back at most that much
        of its worker's usual work, and cheap batches go many to a call."""
        k = self.assigned_per_worker
        cap = min(self.parts.setup.policy.small_reply_batches,  # the workers share the window
                  self.window_batches // max(1, len(self.parts.active_links())))
        recent = self.recorder.recent_costs[w]
        if len(recent) < _COST_SAMPLES_FOR_SIZING or cap <= k:
            return k
        typical = sorted(recent)[len(recent) // 2]
        return max(k, min(cap, int(_HELD_WORK_S / max(typical, 1e-9))))

    def holder(self, number: int) -> Optional[int]:
        return next((w for w, out in enumerate(self.outstanding) if number in out), None)

    def held(self, link: WorkerLink) -> list[int]:
        """The numbers ``link``'s worker holds and has not sent back yet."""
        return list(self.outstanding[link.w])[link.received_waiting():]

    def give(self, w: int, new: dict) -> None:
        """Assign the next number to worker ``w`` (sent with ``new``'s numbers)."""
        self.outstanding[w].append(self.next_number)
        if self.first_number[w] is None:
            self.first_number[w] = self.next_number
        self.last_number[w] = self.next_number
        new.setdefault(w, []).append(self.next_number)
        self.next_number += 1

    def top_up_oldest(self, new: dict) -> None:
        """The worker holding the oldest number not yet received gets numbers until it holds
        its look-ahead and one, whatever the window's bounds: its loader yields that batch
        only once it has drawn that many, and every later step waits for that batch. At most
        the look-ahead beyond the window's bound; nothing where loaders draw nothing ahead."""
        heads = [(out[0], w) for w, out in enumerate(self.outstanding)
                 if out and not self.failed[w]]
        if not heads:
            return
        w = min(heads)[1]
        while len(self.outstanding[w]) < self.draws_ahead[w] + 1:
            self.give(w, new)

    def send(self, new: dict) -> None:
        """Send each worker of ``new`` its numbers (one call, numbered for order)."""
        for w, numbers in new.items():
            link = self.parts.links[w]
            link.send_numbers(self.sends[w], numbers, self.min_batches(link))
            self.sends[w] += 1

    def can_take(self, w: int, number: int) -> bool:
        """Whether live worker ``w`` can make ``number`` next after what it holds: its
        process started before that number (it walks the epoch from a position at or before
        its first number), the number is in the epoch of its highest one, and is among the
        last :data:`PASSED_BATCHES` it walked past or ahead of it."""
        first, last, n = self.first_number[w], self.last_number[w], self.batches_per_epoch
        return (not self.starting[w] and self.takes_part(w) and first is not None
                and n is not None
                and first < number and number // n == last // n
                and last - number < PASSED_BATCHES)

    def restarted(self, link: WorkerLink) -> dict:
        """``link``'s process was restarted. The numbers the dead process did not deliver
        (those of replies received and not yet moved into the window are delivered) go to live
        workers that can make them now; the new process makes the rest, in order, and gets new
        numbers once it answers (a process starts in seconds: numbers given to it would wait
        as long)."""
        w = link.w
        self.sends[w] = 0
        self.first_number[w] = self.last_number[w] = None
        self.starting[w] = True
        received = link.received_waiting()
        out = list(self.outstanding[w])
        kept = self._hand_over(w, out[received:])
        self.outstanding[w] = collections.deque(out[:received] + kept)
        if kept:
            link.actor.assign.remote(0, kept)
            self.sends[w] = 1
            self.first_number[w], self.last_number[w] = kept[0], kept[-1]
        return {"numbers_owed": len(out) - received,
                "handed_to_live_workers": len(out) - received - len(kept)}

    def can_hand_back(self, w: int, numbers: list) -> bool:
        """Whether live workers other than ``w`` can make each of ``numbers``."""
        return all(any(o != w and self.can_take(o, n) for o in range(self.num_workers))
                   for n in numbers)

    def check_started(self) -> None:
        """A restarted or added process that answered ``where()`` takes new numbers from now
        on."""
        for link in self.parts.links:
            if self.starting[link.w]:
                link.node_of(0)
                self.starting[link.w] = link.where_ref is not None

    def let_go(self, drain, changes: list) -> bool:
        """A retired worker whose undelivered numbers live workers can all make now hands
        them back (its batches received are taken into the window first, ``drain(link)``)
        and its actor is killed: the path a dead worker's numbers take. Until then it makes
        the batches of the numbers it holds, and gets no new ones. Returns whether one left
        (noted in ``changes``)."""
        left = False
        for w in sorted(self.leaving):
            link = self.parts.links[w]
            drain(link)
            out = list(self.outstanding[w])
            if self.failed[w] or not self.can_hand_back(w, out):
                continue
            link.kill()
            link.retired = True
            kept = self._hand_over(w, out)
            assert not kept, (w, kept)  # can_hand_back said they all can
            self.outstanding[w].clear()
            self.leaving.discard(w)
            changes.append({"retired": w, "step": self.parts.position(), "handed_back": len(out)})
            left = True
        return left

    def _hand_over(self, dead: int, numbers: list) -> list:
        """Give each of ``numbers`` (those worker ``dead`` owed, in order) to the live worker
        holding the fewest that can make it (:meth:`can_take`), one on a node where no worker
        just died if there is one; returns those none can take."""
        suspects = set(self.parts.placer.suspects())
        given: dict[int, list[int]] = {}
        kept = []
        for number in numbers:
            able = [w for w in range(self.num_workers)
                    if w != dead and self.can_take(w, number)]
            healthy = [w for w in able if (self.parts.links[w].node or {}).get("node_id")
                       not in suspects]
            if not able:
                kept.append(number)
                continue
            w = min(healthy or able, key=lambda i: len(self.outstanding[i]))
            self.outstanding[w].append(number)
            given.setdefault(w, []).append(number)
        self.send(given)
        return kept


class DynamicAssignment:
    """The workers take the next global batch numbers as they have room (:class:`NumberBook`);
    their replies land in a reorder window keyed by number, from which :meth:`next_reply`
    releases them in order. A thread (the pump) takes in every worker's replies as they come
    and hands out numbers, whether or not the stream is asking for a batch.

    The policy's ``assigned_batches_per_worker`` bounds the numbers a worker holds (the one it
    produces and the ones queued behind it), and its
    :meth:`~workers.flow.FlowPolicy.reorder_window_batches` the numbers issued beyond the last
    delivered step (None: ``num_workers_per_csx`` x the stream's ``max_batches_ahead``, what
    the workers' buffers hold together under round-robin: the same bound on memory). The wait
    attributable to stragglers is the time a step waited while later batches were already in
    the window (from the moment the first one arrived), counted against the worker that
    produced the step.
    """

    mode = "dynamic"

    def __init__(self, parts: StreamParts, recorder: AssignmentRecorder, draws_ahead: list,
                 start: Optional[WorkerPosition]):
        """``draws_ahead``: what each worker's loader draws ahead, as the workers said."""
        self.parts, self.recorder = parts, recorder
        self.reason = recorder.reason
        book = self.book = NumberBook(parts, recorder, draws_ahead)
        self._size_window()
        self._window: dict[int, tuple[int, WorkerReply]] = {}  # number -> (worker, item)
        self._window_bytes = 0
        self._refilling = False  # the window was filled to its bound: refilled in chunks
        self._refill_free = 1  # numbers free in a refilling window when the pump refills it
        self._start = start
        self._delivered_after: Optional[WorkerPosition] = None
        self._occupancy_sum = self._occupancy_max = self._deliveries = 0
        self._pump_cpu_s = 0.0  # the coordinator thread's CPU time
        self._issue_cpu_s = 0.0  # its CPU time choosing workers for numbers and sending them
        self._cond = threading.Condition()  # guards everything the pump thread touches
        self._pump_error: Optional[BaseException] = None
        self.changes: list[dict] = []  # workers added and retired while the stream ran
        if start is not None:
            for link in parts.links:
                link.resume_at(start)
        # the pump goes back to every worker's replies after a restart (the numbers the dead
        # one owed may now be with the others)
        self.supervisor = parts.supervise(on_restart=book.restarted, waits_after_restart=False)
        try:
            book.batches_per_epoch = ray.get(
                parts.links[0].actor.batches_per_epoch.remote(), timeout=60)
        except ray.exceptions.RayError:
            pass  # None: a dead worker's numbers wait for its new process
        with self._cond:
            self._issue()
        self._pump_thread: Optional[threading.Thread] = None
        pump = threading.Thread(target=self._pump, daemon=True,
                                name=f"coordinator-csx{parts.wse_id}")
        pump.start()
        self._pump_thread = pump  # close() joins only a started thread, even after a Ctrl-C

    @property
    def window_batches(self) -> int:
        return self.book.window_batches

    def _size_window(self) -> None:
        """The reorder window's base bound for the workers taking part: never less than
        every worker's share, so the window never starves a worker outright."""
        p, book = self.parts, self.book
        W = len(p.active_links())
        window = p.setup.policy.reorder_window_batches(W) or W * p.max_batches_ahead
        book.base_window = max(window, W * book.assigned_per_worker)

    # -- handing out numbers --------------------------------------------------------------
    def _window_full(self) -> bool:
        book = self.book
        if book.next_number >= self.parts.position() + book.window_batches:
            return True
        limit = self.parts.setup.in_flight_bytes_per_worker
        return limit is not None and bool(self._window) and \
            self._window_bytes >= limit * book.num_workers

    def _refill_due(self, step: int) -> bool:
        """Whether the window, once ``step`` is the next to deliver, takes new numbers: it is
        not refilling, or a refill's worth of it is free."""
        return not self._refilling or \
            step + self.book.window_batches - self.book.next_number >= self._refill_free

    def _issue(self) -> None:
        """Give the next numbers to the workers with room, fewest held first. A full window
        is refilled once an eighth of it is free, and at least as many numbers as the workers
        may hold together (a full reply each where batches are cheap; at most half the
        window), not a number at a time: with input faster than the wafer it is full nearly
        always, and one number a step would cost one ``assign`` call and one reply a step."""
        book, W = self.book, self.book.num_workers
        for link in self.parts.links:  # the window may have grown with a look-ahead learnt
            book.note_costs(link)
        k = [book.numbers_per_worker(w) + book.draws_ahead[w] for w in range(W)]
        refill = max(1, book.window_batches // _REFILL_FRACTION,
                     min(sum(k), book.window_batches // 2))
        self._refill_free = refill
        new: dict[int, list[int]] = {}
        step = self.parts.position()
        if self._refill_due(step):
            self._refilling = False
            while not self._window_full():
                free = [w for w in range(W) if len(book.outstanding[w]) < k[w]
                        and not book.starting[w] and book.takes_part(w)]
                if not free:
                    break
                w = min(free, key=lambda i: len(book.outstanding[i]))
                book.give(w, new)
            self._refilling = book.next_number >= step + book.window_batches
        book.top_up_oldest(new)
        book.send(new)

    # -- taking replies in ----------------------------------------------------------------
    def _drain(self, link: WorkerLink) -> None:
        """Move ``link``'s received replies into the reorder window."""
        book, w = self.book, link.w
        while link.ready:
            item = link.take()
            if item.failed:
                # the batch the worker was making: its oldest number not received
                number = book.outstanding[w][0] if book.outstanding[w] else self.parts.position()
                item.number = number
                self._window.setdefault(number, (w, item))
                book.failed[w] = True
                continue
            expected = book.outstanding[w].popleft() if book.outstanding[w] else None
            if item.number != expected:  # a broken invariant, never silently wrong data
                raise WorkerFailed(link, WorkerReply.failure(
                    "RuntimeError", f"expected global batch {expected}, received {item.number}",
                    "in transport"))
            self._window[item.number] = (w, item)
            self._window_bytes += item.nbytes
            self.recorder.cost(w, item.produce_s)
            book.note_costs(link)
            self.recorder.idle_s[w] += item.idle_s


    def _pump(self) -> None:
        """The coordinator's thread: take in every worker's replies as they come and hand out
        numbers, whether or not the wafer's feeder is asking for a batch (it asks once a step
        while the wafer's input buffer is full), so a worker is never left waiting for its
        next number."""
        cpu0 = time.thread_time()
        parts, book = self.parts, self.book
        try:
            while not parts.is_closed():
                self._pump_cpu_s = time.thread_time() - cpu0
                with self._cond:
                    book.check_started()
                    if book.leaving and book.let_go(self._drain, self.changes):
                        self._size_window()
                    t0 = time.thread_time()
                    self._issue()
                    self._issue_cpu_s += time.thread_time() - t0
                    by_ref = {}
                    for link in parts.links:
                        if book.outstanding[link.w] and not link.pending and not link.ready:
                            link.request(min_batches=book.min_batches(link))
                        if link.ready:
                            self._drain(link)
                        if book.outstanding[link.w] and link.pending:
                            by_ref[link.pending[0][1]] = link
                    self._cond.notify_all()
                    if not by_ref:
                        # no worker holds a number (the window is full, or waits to be
                        # refilled): next_reply() wakes this thread when it moves the window on
                        self._cond.wait(_PUMP_WAIT_S)
                        continue
                done, _ = ray.wait(list(by_ref), num_returns=1,
                                   timeout=_PUMP_WAIT_S, fetch_local=False)
                if not done:
                    continue
                with self._cond:
                    for ref in done:
                        link = by_ref[ref]
                        if link.pending and link.pending[0][1] is ref:
                            # it is there; restarts a dead one
                            if link.receive(self.supervisor, numbered=True):
                                book.drawn_ahead(link, link.reported_drawn_ahead)
                            link.request(min_batches=book.min_batches(link))
                            self._drain(link)
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 (raised by next_reply() in the consumer's thread)
            with self._cond:
                if not parts.is_closed() or self._pump_error is None:
                    self._pump_error = e
                self._cond.notify_all()

    def _wait_for(self, number: int) -> float:
        """Wait (the caller holds ``_cond``) until ``number`` is in the window; returns how
        long of that wait later batches were already in the window (straggler wait)."""
        parts = self.parts
        timeout = parts.cs_config.straggler_timeout_s
        wait_start = time.perf_counter()
        next_report = timeout
        ahead_since = None
        while number not in self._window:
            if self._pump_error is not None:
                raise self._pump_error
            self.supervisor.check_open()
            if ahead_since is None and any(n > number for n in self._window):
                ahead_since = time.perf_counter()
            self._cond.wait(self.supervisor.poll_s)
            waited = time.perf_counter() - wait_start
            holder = self.book.holder(number)
            if waited >= next_report and holder is not None and number not in self._window:
                self._cond.release()
                try:
                    self.supervisor.report_straggler(parts.links[holder], waited)
                finally:
                    self._cond.acquire()
                next_report = max(2 * next_report, waited + timeout)
        return 0.0 if ahead_since is None else time.perf_counter() - ahead_since

    # -- delivering -----------------------------------------------------------------------
    def next_reply(self) -> tuple[WorkerLink, WorkerReply]:
        step = self.parts.position()
        with self._cond:
            if step not in self._window:
                straggling = self._wait_for(step)
                self.recorder.straggler_wait[self._window[step][0]] += straggling
            w, item = self._window.pop(step)
            self._occupancy_sum += len(self._window)
            self._occupancy_max = max(self._occupancy_max, len(self._window))
            self._deliveries += 1
            if not item.failed:
                self._window_bytes -= item.nbytes
                self._delivered_after = item.after
                # the window moved on: the pump hands the freed numbers to workers with room,
                # off this (the wafer feeder's) thread; a refilling window, once a refill's
                # worth is free (woken every step, the pump would take the GIL from the
                # wafer every step for nothing)
                if self._refill_due(step + 1):
                    self._cond.notify_all()
        link = self.parts.links[w]
        if item.failed:
            raise WorkerFailed(link, item)
        return link, item

    def failed_batch(self, link: WorkerLink, reply: WorkerReply) -> Optional[int]:
        """The number the worker was producing (not the round-robin formula's)."""
        if reply.number is not None:
            return reply.number
        index = reply.index
        pos = None if index is None else index - (link.received - link.received_waiting())
        out = self.book.outstanding[link.w]
        return out[pos] if pos is not None and 0 <= pos < len(out) else None

    def wait_for_keys(self) -> None:
        parts = self.parts
        with self._cond:
            # the pump takes in the replies (and their keys); every worker holds numbers
            # from the start, so each gets its first batches
            while not all(link.received >= link.keys_until or self.book.failed[link.w]
                          or link.retired for link in parts.links):
                if self._pump_error is not None:
                    raise self._pump_error
                self.supervisor.check_open()
                self._cond.wait(self.supervisor.poll_s)

    def stall_report(self, keys_wait: bool) -> list[dict]:
        """Every worker holding numbers not yet received, the holder of the next step's
        number first; while the duplicate check waits for the workers' first batches, those
        it waits for."""
        parts = self.parts
        with self._cond:
            number = parts.position()
            owing = [(link, self.book.held(link)) for link in parts.links
                     if not (keys_wait and link.received >= link.keys_until)]
            owing = [o for o in owing if o[1]]
        owing.sort(key=lambda o: number not in o[1])
        owed = self.supervisor.with_stacks(owing, parts.first_step)
        if not keys_wait and not any(number in o[1] for o in owing):  # a broken invariant
            owed.insert(0, {"wse_id": parts.wse_id, "local_worker_id": None,
                            "batches": [(number, number - parts.first_step + 1)],
                            "note": "(no input worker holds this global batch: the coordinator "
                                    "has not assigned it)"})
        return owed

    def resume_states(self) -> list[DataLoaderCheckpoint]:
        with self._cond:
            return dynamic_resume_states(self.parts, self._delivered_after or self._start)

    def ready_count(self, peeked: bool) -> int:
        with self._cond:
            return len(self._window)

    def close(self) -> None:
        """Wake the pump thread (the stream is closed) and wait for it to end."""
        pump = self._pump_thread
        if pump is not None and pump is not threading.current_thread():
            with self._cond:
                self._cond.notify_all()
            pump.join(timeout=5)

    # -- changing the workers -------------------------------------------------------------
    def change_support(self) -> tuple[bool, str]:
        return True, "dynamic assignment takes in and lets go of workers at any step"

    def active_workers(self) -> list[int]:
        with self._cond:
            return [link.w for link in self.parts.active_links()
                    if link.w not in self.book.leaving]

    def change_workers(self, add: int, retire: list[int], pool: WorkerPool) -> Assignment:
        """Added workers start at the position after the last delivered batch and get numbers
        once their process answers; a retired one gets no new numbers, and hands back the
        numbers it owes once live workers can make them all (else it makes them first), then
        its actor is killed. Worker ids are never reused."""
        p, book = self.parts, self.book
        with self._cond:
            at = self._delivered_after or self._start or p.links[0].consumed_after
            ahead = max(book.draws_ahead, default=0)
        # a new worker's own count starts at 0, at the stream's place in the data
        added = [pool.new_link(len(p.links) + i, len(p.links) + add, at.joined(), added=True)
                 for i in range(add)]
        pool.start(added)  # outside the lock: the pump goes on meanwhile
        with self._cond:
            for link in added:
                p.links.append(link)
                book.add_worker(ahead, starting=True)
                self.recorder.add_worker()
                self.changes.append({"added": link.w, "step": p.position()})
            book.leaving.update(retire)
            self._size_window()
            self._cond.notify_all()
        return self

    def stats(self, transport: dict) -> dict:
        with self._cond:
            book, W = self.book, self.book.num_workers
            out = self.recorder.stats(transport, self.mode, {
                "assigned_batches_per_worker": [book.numbers_per_worker(w) for w in range(W)],
                "reorder_window_batches": book.window_batches,
                "draws_ahead": list(book.draws_ahead)})
            out["worker_changes"] = list(self.changes)
            out["coordinator"] = {
                "numbers_assigned": book.next_number - book.first_issued,
                "thread_cpu_s": self._pump_cpu_s, "issuing_cpu_s": self._issue_cpu_s}
            out["reorder_window"] = {
                "max_batches": self._occupancy_max,
                "mean_batches": self._occupancy_sum / self._deliveries if self._deliveries
                else 0.0,
                "capacity_batches": book.window_batches}
            for entry in out["workers"]:
                w = entry["local_worker_id"]
                entry["waiting_for_numbers_s"] = self.recorder.idle_s[w]
                entry["draws_ahead"] = book.draws_ahead[w]
            return out
