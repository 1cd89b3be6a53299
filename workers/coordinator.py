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
(:class:`~workers.assignment.RoundRobin`); the stream's ``stats`` say which mode ran and why.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import ray

from workers.assignment import AssignmentRecorder, StreamParts, dynamic_resume_states
from workers.context import DataLoaderCheckpoint
from workers.link import WorkerFailed, WorkerLink
from workers.replies import WorkerReply
from workers.sharding import PASSED_BATCHES
from workers.stream import CsxInputStream

__all__ = ["CoordinatedInputStream", "DynamicAssignment", "NumberBook"]

_PUMP_WAIT_S = 0.02  # the pump's longest wait for replies before it looks for new work
_HELD_WORK_S = 0.005
"""Dynamic assignment: cheap batches are assigned to a worker this much work at a time (by
the median of its recent batch costs), so that one call and one reply serve many batches."""
_REFILL_FRACTION = 8  # a full reorder window is refilled once this fraction of it is free
_COST_SAMPLES_FOR_SIZING = 8  # batch costs seen before the assignment size follows them


class CoordinatedInputStream(CsxInputStream):
    """A :class:`~workers.stream.CsxInputStream` whose assignment follows
    ``CSConfig.input_assignment`` (:class:`~workers.assignment.ConfiguredPlan`): dynamic where
    the loaders take part, else round-robin, recording either way what the run report needs
    about stragglers. Takes the stream's arguments."""

    def __init__(self, dataloader, cs_config, wse_id, *, resume_states=None, **options):
        from workers.assignment import ConfiguredPlan

        super().__init__(dataloader, cs_config, wse_id, resume_states=resume_states,
                         plan=ConfiguredPlan(cs_config, resume_states), **options)

    @property
    def window_batches(self) -> int:
        """The reorder window's bound in batches (dynamic assignment)."""
        return self.assignment.window_batches

    @property
    def assigned_per_worker(self) -> int:
        """Numbers a worker holds at most where its batches are not cheap (dynamic
        assignment)."""
        return self.assignment.book.assigned_per_worker


class NumberBook:
    """Which worker holds which global batch numbers: handed out in increasing order, each
    worker holding at most :meth:`numbers_per_worker` plus its loader's look-ahead, and sent to
    the workers through their links."""

    def __init__(self, parts: StreamParts, recorder: AssignmentRecorder):
        W = self.num_workers = len(parts.links)
        self.parts, self.recorder = parts, recorder
        self.assigned_per_worker = parts.setup.policy.assigned_batches_per_worker
        # each worker's numbers assigned, not yet received (its link's deque)
        self.outstanding = [link.numbers for link in parts.links]
        self.sends = [0] * W  # assign() calls made to each worker's current actor
        self.next_number = self.first_issued = parts.position()
        self.failed = [False] * W  # a worker's error reply is in the window
        # each worker's current process: the first and the highest number assigned to it
        self.first_number: list[Optional[int]] = [None] * W
        self.last_number: list[Optional[int]] = [None] * W
        self.starting = [False] * W  # a restarted process that has not answered yet
        self.batches_per_epoch: Optional[int] = None  # global batches of an epoch
        self.base_window = 0  # the reorder window's bound before the look-aheads, set once

    @property
    def window_batches(self) -> int:
        """The reorder window: its base size plus every worker's look-ahead, so that the
        workers can hold their share and the numbers their loaders draw ahead together."""
        return self.base_window + sum(link.draws_ahead for link in self.parts.links)

    def note_costs(self, link: WorkerLink) -> None:
        """Whether ``link``'s worker now gets many numbers per reply (its batches are cheap)."""
        link.many_per_reply = self.numbers_per_worker(link.w) > self.assigned_per_worker

    def numbers_per_worker(self, w: int) -> int:
        """Numbers worker ``w`` may hold now: ``assigned_per_worker``, or, where its batches
        are so cheap that it makes more than that in ``_HELD_WORK_S``, as many as it makes in
        that time (by its own median batch cost; at most the policy's ``small_reply_batches``
        and its share of the reorder window). A slow batch then holds back at most that much
        of its worker's usual work, and cheap batches go many to a call."""
        k = self.assigned_per_worker
        cap = min(self.parts.setup.policy.small_reply_batches,
                  self.window_batches // self.num_workers)  # the workers share the window
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
        while len(self.outstanding[w]) < self.parts.links[w].draws_ahead + 1:
            self.give(w, new)

    def send(self, new: dict) -> None:
        """Send each worker of ``new`` its numbers (one call, numbered for order)."""
        for w, numbers in new.items():
            self.parts.links[w].send_numbers(self.sends[w], numbers)
            self.sends[w] += 1

    def can_take(self, w: int, number: int) -> bool:
        """Whether live worker ``w`` can make ``number`` next after what it holds: its
        process started before that number (it walks the epoch from a position at or before
        its first number), the number is in the epoch of its highest one, and is among the
        last :data:`PASSED_BATCHES` it walked past or ahead of it."""
        first, last, n = self.first_number[w], self.last_number[w], self.batches_per_epoch
        return (not self.starting[w] and first is not None and n is not None
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
        link.numbers.clear()
        link.numbers.extend(out[:received] + kept)
        if kept:
            link.actor.assign.remote(0, kept)
            self.sends[w] = 1
            self.first_number[w], self.last_number[w] = kept[0], kept[-1]
        return {"numbers_owed": len(out) - received,
                "handed_to_live_workers": len(out) - received - len(kept)}

    def _hand_over(self, dead: int, numbers: list) -> list:
        """Give each of ``numbers`` (those worker ``dead`` owed, in order) to the live worker
        holding the fewest that can make it (:meth:`can_take`), one on a node where no worker
        just died if there is one; returns those none can take."""
        suspects = set(self.parts.supervisor.placer.suspects())
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
                 start: Optional[dict]):
        """``draws_ahead``: what each worker's loader draws ahead, as the workers said."""
        self.parts, self.recorder = parts, recorder
        self.reason = recorder.reason
        W = len(parts.links)
        book = self.book = NumberBook(parts, recorder)
        # never less than every worker's share, so the window never starves a worker outright
        window = parts.setup.policy.reorder_window_batches(W) or W * parts.max_batches_ahead
        book.base_window = max(window, W * book.assigned_per_worker)
        self._window: dict[int, tuple[int, WorkerReply]] = {}  # number -> (worker, item)
        self._window_bytes = 0
        self._refilling = False  # the window was filled to its bound: refilled in chunks
        self._refill_free = 1  # numbers free in a refilling window when the pump refills it
        self._start = start
        self._delivered_after: Optional[dict] = None
        self._occupancy_sum = self._occupancy_max = self._deliveries = 0
        self._pump_cpu_s = 0.0  # the coordinator thread's CPU time
        self._issue_cpu_s = 0.0  # its CPU time choosing workers for numbers and sending them
        self._cond = threading.Condition()  # guards everything the pump thread touches
        self._pump_error: Optional[BaseException] = None
        for link, ahead in zip(parts.links, draws_ahead):
            link.draws_ahead = ahead
            if start is not None:
                link.resume_at(start)
        parts.supervisor.on_restart = book.restarted
        # the pump goes back to every worker's replies (the numbers the dead one owed may now
        # be with the others)
        parts.supervisor.waits_after_restart = False
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
        k = [book.numbers_per_worker(w) + self.parts.links[w].draws_ahead for w in range(W)]
        refill = max(1, book.window_batches // _REFILL_FRACTION,
                     min(sum(k), book.window_batches // 2))
        self._refill_free = refill
        new: dict[int, list[int]] = {}
        step = self.parts.position()
        if self._refill_due(step):
            self._refilling = False
            while not self._window_full():
                free = [w for w in range(W)
                        if len(book.outstanding[w]) < k[w] and not book.starting[w]]
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

    def _check_started(self) -> None:
        """A restarted process that answered ``where()`` takes new numbers from now on."""
        for link in self.parts.links:
            if self.book.starting[link.w]:
                link.node_of(0)
                self.book.starting[link.w] = link.where_ref is not None

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
                    self._check_started()
                    t0 = time.thread_time()
                    self._issue()
                    self._issue_cpu_s += time.thread_time() - t0
                    by_ref = {}
                    for link in parts.links:
                        if book.outstanding[link.w] and not link.pending and not link.ready:
                            link.request()
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
                            link.receive(parts.supervisor)  # it is there; restarts a dead worker
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
            parts.supervisor.check_open()
            if ahead_since is None and any(n > number for n in self._window):
                ahead_since = time.perf_counter()
            self._cond.wait(parts.supervisor.poll_s)
            waited = time.perf_counter() - wait_start
            holder = self.book.holder(number)
            if waited >= next_report and holder is not None and number not in self._window:
                self._cond.release()
                try:
                    parts.supervisor.report_straggler(parts.links[holder], waited)
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
                          for link in parts.links):
                if self._pump_error is not None:
                    raise self._pump_error
                parts.supervisor.check_open()
                self._cond.wait(parts.supervisor.poll_s)

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
        owed = parts.supervisor.with_stacks(owing, parts.first_step)
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

    def stats(self, transport: dict) -> dict:
        with self._cond:
            book, W = self.book, self.book.num_workers
            out = self.recorder.stats(transport, self.mode, {
                "assigned_batches_per_worker": [book.numbers_per_worker(w) for w in range(W)],
                "reorder_window_batches": book.window_batches,
                "draws_ahead": [link.draws_ahead for link in self.parts.links]})
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
                entry["draws_ahead"] = self.parts.links[w].draws_ahead
            return out
