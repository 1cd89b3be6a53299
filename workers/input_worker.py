"""One input node of the simulated Wafer-Scale Cluster: the :class:`InputWorker` Ray actor.

An ``InputWorker`` builds its dataloader by calling the user's ``input_fn`` as one worker of one
CS-X, then a background thread iterates it (cycling through epochs) into a small bounded buffer.
The consumer (:class:`workers.stream.CsxInputStream`) asks for batch ``k`` with ``fetch(k)`` (or
for batch ``k`` and up to ``n - 1`` ready ones after it in one reply with ``fetch(k, n)``); the
producer never runs more than ``capacity`` unfetched batches ahead, so memory stays bounded.

Every reply carries the worker's position right after that batch (epoch, batches within the
epoch, and the restartable loader's ``state_dict()`` when it has one), so the consumer always
knows the exact resume point of what it consumed, even after the actor died.

Replies travel in the input side's wire format (:mod:`workers.wire`).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

import ray
import torch

from workers import environ
from workers.context import DataLoaderCheckpoint, WorkerInfo, streamer_context, worker_context
from workers.dataloader import DataLoader
from workers.duplicates import sample_keys
from workers.positions import RoundRobinOrder, WorkerPosition
from workers.resume import Source, check_position
from workers.shares import FailedShare, share_for
from workers.stall import thread_stacks
from workers.wire import Reply, batch_nbytes, chunk_reply, error_reply, leading_dim, packed_item

_REPLY_WAIT_S = 0.05
"""The longest a ``fetch`` with ``min_count > 1`` waits for those batches beyond the first."""


class InputWorkerImpl:
    """The body of the :data:`InputWorker` actor (usable in-process for debugging).

    Args:
        dataloader: the :class:`workers.dataloader.DataLoader` recipe.
        info: which worker of which CS-X this is.
        start: where to start (a :class:`~workers.positions.WorkerPosition`; None: at the
            beginning).
        capacity: the most batches produced but not yet fetched.
        capacity_bytes: the most bytes of batches produced but not yet fetched (at least one
            batch is always allowed); None: bounded in batches only.
        keys_until: batches with an index below this carry their sample keys (sample ids, or a
            content digest) for the duplicate check of :mod:`workers.duplicates`.
        owns_global_rng: the process runs nothing but this worker (a Ray actor), so torch's
            global RNG is the input pipeline's (see :class:`workers.resume.Source`).
        dynamic: ask for dynamic assignment: if the loader can take part
            (:func:`workers.loaders.dynamic_assignment_support`), the worker produces the
            global batches whose numbers :meth:`assign` gives it, starting from
            ``dynamic_start`` (a loader position; None: ``start``'s), and every batch
            carries its number as ``"step"``; otherwise it runs as without (round-robin).
            :meth:`assignment_mode` tells which, and how many numbers the loader draws ahead
            of the batch it yields (:func:`workers.loaders.draws_ahead`). Where it draws more
            than that (a prefetching sampler wrapper), a ``fetch`` that waits while the loader
            waits for a number with batches drawn and not yet produced replies
            ``{"kind": "need_numbers", "index": i, "drawn_ahead": n}`` instead of the batch
            (once for each new, larger ``n``): the coordinator then grants ``n`` numbers more
            and asks for batch ``i`` again.
    """

    def __init__(self, dataloader: DataLoader, info: WorkerInfo,
                 start: WorkerPosition | None = None, capacity: int = 2,
                 capacity_bytes: int | None = None, keys_until: int = 0,
                 owns_global_rng: bool = False, dynamic: bool = False,
                 dynamic_start: dict | None = None):
        start = start or WorkerPosition()
        w, W = info.local_worker_id, info.num_workers_per_csx
        # what the worker produces under its assignment (workers.shares), decided once the
        # loader is built
        self._share = share_for(bool(dynamic), w, W, self._wake, dynamic_start)
        self._share_known = threading.Event()
        self._reported_ahead = 0  # the largest drawn_ahead a need_numbers reply sent
        self.info = info
        self.dataloader = dataloader
        self.capacity = max(1, int(capacity))
        self.capacity_bytes = capacity_bytes
        self.keys_until = int(keys_until)
        self.owns_global_rng = owns_global_rng
        self.first_index = start.worker_step
        self._position = check_position(dict(start.loader))
        self._cond = threading.Condition()
        self._buffer: dict[int, dict] = {}
        self._buffer_bytes = 0
        self._next_index = self.first_index  # index of the next batch to produce
        self._error: dict | None = None
        self._stop = False
        self.produced = 0
        self.state = DataLoaderCheckpoint(
            local_worker_id=info.local_worker_id, num_workers_per_csx=info.num_workers_per_csx,
            num_csx=info.num_csx, wse_id=info.wse_id,
            appliance_step=RoundRobinOrder(W).steps_after(w, self.first_index),
            worker_step=self.first_index, samples_streamed=start.samples_streamed,
            user_state_dict=self._position,
        )
        self._thread = threading.Thread(
            target=self._run, daemon=True,
            name=f"input-worker-csx{info.wse_id}-w{info.local_worker_id}")
        self._thread.start()

    # -- the producer thread ------------------------------------------------------------------
    def _full(self, nbytes: int) -> bool:
        if not self._buffer:
            return False
        if len(self._buffer) >= self.capacity:
            return True
        return self.capacity_bytes is not None and \
            self._buffer_bytes + nbytes > self.capacity_bytes

    def _put(self, item: dict) -> bool:
        with self._cond:
            while not self._stop and self._full(item["nbytes"]):
                self._cond.wait()
            if self._stop:
                return False
            self._buffer[item["index"]] = item
            self._buffer_bytes += item["nbytes"]
            self._next_index = item["index"] + 1
            self._cond.notify_all()
            return True

    def _pop(self, index: int) -> dict | None:
        """Take batch ``index`` out of the buffer (the caller holds ``_cond``)."""
        item = self._buffer.pop(index, None)
        if item is not None:
            self._buffer_bytes -= item["nbytes"]
        return item

    def _fail(self, exc: BaseException, during: str) -> None:
        with self._cond:
            self._error = error_reply(self._next_index, exc, during)
            self._cond.notify_all()

    def _decide_share(self, loader) -> None:
        """What the worker produces: numbered batches where dynamic assignment was asked for
        and the loader can take part, else its round-robin shard."""
        self._share = self._share.decide(loader, self.info.local_worker_id,
                                         self.info.num_workers_per_csx)
        self._position = check_position(dict(self._share.start(self._position)))
        self.state.user_state_dict = self._position
        self._share_known.set()

    def _run(self) -> None:
        info = self.info
        environ.apply(getattr(self.dataloader, "worker_env", None))
        if self.owns_global_rng and self.dataloader.client_rng_state is not None:
            torch.set_rng_state(self.dataloader.client_rng_state)
        with worker_context(info, self.state), streamer_context():
            decided = False
            try:
                loader = self.dataloader.build(info)
                self._decide_share(loader)
                decided = True
                source = Source(self.dataloader, loader, self._position,
                                owns_global_rng=self.owns_global_rng)
            except BaseException as e:  # noqa: BLE001 (sent to the consumer)
                if not decided:
                    self._share.close()
                    self._share = FailedShare(info.local_worker_id, info.num_workers_per_csx, "")
                self._share_known.set()
                self._fail(e, "while building its dataloader")
                return
            with self._share.producing():
                self._produce(source)

    def _produce(self, source: Source) -> None:
        share = self._share
        while not self._stop:
            index = self._next_index
            try:
                t0, t0_unix, t0_cpu = time.perf_counter(), time.time(), time.thread_time()
                idle0 = share.idle_s()
                batch = next(source)
                idle = share.idle_s() - idle0  # waiting for a number is no part of the cost
                t0 += idle
                t0_unix += idle
                self.produced += 1
                st = self.state
                st.worker_step = index + 1
                st.samples_streamed += leading_dim(batch)
                # a fresh dict each batch, never changed after: the reply and the worker's
                # state share it
                position = source.position()
                st.user_state_dict = position
                # packed by the fetch call that sends it, off the producer's path
                item = {
                    "kind": "batch",
                    "index": index,
                    "batch": batch,
                    "nbytes": batch_nbytes(batch),
                    "after": WorkerPosition(st.worker_step, st.samples_streamed, position),
                    "produce_s": time.perf_counter() - t0,
                    # wall-clock span of the production, for the run's timeline
                    "produced_unix": (t0_unix, time.time()),
                    "produce_cpu_s": time.thread_time() - t0_cpu,
                }
                st.appliance_step = share.stamp(item, idle)
                if index < self.keys_until:
                    item["keys"] = sample_keys(batch, source.epoch,
                                               source.last_sample_ids())
            except BaseException as e:  # noqa: BLE001 (sent to the consumer)
                if self._stop:
                    return
                self._fail(e, "while producing this batch")
                return
            del batch
            if not self._put(item):
                return

    # -- remote methods -----------------------------------------------------------------------
    def fetch(self, index: int, count: int = 1, max_bytes: int | None = None,
              min_count: int = 1, assign: tuple | None = None) -> Reply:
        """Batch ``index`` of this worker (waits for it), or an error reply, wrapped for
        transport (:class:`Reply`).

        With ``count > 1``: a ``"chunk"`` reply holding batch ``index`` (waited for) and those
        after it that are already produced, at most ``count`` items and (beyond the first)
        at most ``max_bytes`` in all (an error item ends the chunk). One reply for several
        batches pays Ray's per-call and per-object costs once. ``min_count``: the reply also
        waits for the batches up to ``index + min_count - 1`` (cheap batches whose numbers
        the worker holds, under dynamic assignment: a reply then carries several of them),
        for at most ``_REPLY_WAIT_S`` and while the buffer has room; 1: it never delays a
        batch that is ready. ``assign``: ``(send, numbers)`` of an :meth:`assign` made by the
        same call (dynamic assignment: one call where two would go out together).
        """
        if assign is not None:
            self.assign(*assign)
        first = self._take(index)
        if count == 1 or first["kind"] == "need_numbers":
            return Reply(packed_item(first))
        items = [first]
        nbytes = first.get("nbytes", 0)
        with self._cond:
            i = index + 1
            last = index + min(count, min_count) - 1
            deadline = time.perf_counter() + _REPLY_WAIT_S
            while first["kind"] != "error" and not self._stop and self._error is None and \
                    any(j not in self._buffer for j in range(i, last + 1)) and \
                    len(self._buffer) < self.capacity and \
                    (max_bytes is None or self._buffer_bytes < max_bytes):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            while first["kind"] != "error" and len(items) < count:
                nxt = self._buffer.get(i)
                if nxt is not None and max_bytes is not None and \
                        nbytes + nxt["nbytes"] > max_bytes:
                    break
                item = self._pop(i)
                if item is None:
                    if self._error is not None and self._error["index"] == i:
                        items.append(self._error)
                    break
                items.append(item)
                nbytes += item["nbytes"]
                i += 1
            self._cond.notify_all()
        return Reply(chunk_reply(index, items))

    def _wake(self) -> None:
        """The loader waits for a number with batches drawn ahead: wake a waiting ``fetch``."""
        with self._cond:
            self._cond.notify_all()

    def _take(self, index: int) -> dict:
        with self._cond:
            while True:
                item = self._pop(index)
                if item is not None:
                    self._cond.notify_all()
                    return item
                if self._error is not None and index >= self._error["index"]:
                    return self._error
                ahead = self._share.waiting_ahead()
                if ahead > self._reported_ahead:
                    self._reported_ahead = ahead
                    return {"kind": "need_numbers", "index": index, "drawn_ahead": ahead}
                if index < self._next_index and index not in self._buffer:
                    return error_reply(index, RuntimeError(
                        f"batch {index} was already delivered or never requested in order"),
                        "(internal: duplicate fetch)")
                self._cond.wait(0.5)

    def assign(self, send: int, numbers: list) -> None:
        """Global batch numbers for this worker to produce, in increasing order (dynamic
        assignment); ``send`` numbers the calls 0, 1, 2, ... so they apply in order."""
        self._share.assign(send, numbers)

    def assignment_mode(self, timeout_s: float = 600.0) -> tuple[str, str, int]:
        """``(mode, why, draws_ahead)`` once the dataloader is built: ``"dynamic"`` or
        ``"static"`` (or ``"failed"``: building it raised, and ``fetch`` replies with the
        error), and the index batches the loader draws ahead of the one it yields."""
        if not self._share_known.wait(timeout_s):
            return ("failed", f"the dataloader was not built within {timeout_s:.0f} s", 0)
        share = self._share
        return (share.mode, share.why, share.draws_ahead)

    def worker_change_support(self, timeout_s: float = 600.0) -> tuple[bool, str]:
        """Once the dataloader is built: whether a round-robin stream can re-form its workers
        from the exact position (:func:`workers.loaders.worker_change_support`), and why."""
        if not self._share_known.wait(timeout_s):
            return (False, f"the dataloader was not built within {timeout_s:.0f} s")
        return self._share.change_support

    def batches_per_epoch(self, timeout_s: float = 600.0) -> int | None:
        """Under dynamic assignment, the global batches of an epoch (numbers ``e * n`` to
        ``e * n + n - 1`` are epoch ``e``'s), once the dataloader is built; else None."""
        self._share_known.wait(timeout_s)
        return self._share.batches_per_epoch

    def dump_stack(self) -> str:
        """The Python stacks of this worker's threads, producer first."""
        frames = sys._current_frames()
        me = threading.get_ident()
        threads = sorted(threading.enumerate(), key=lambda t: t is not self._thread)
        out = []
        for t in threads:
            if t.ident == me or t.ident not in frames:
                continue
            out.append(f'Thread "{t.name}":\n' + "".join(traceback.format_stack(frames[t.ident])))
        return "\n".join(out)

    def thread_stacks(self) -> dict:
        """``{"pid", "threads"}``: the Python stacks of this worker's threads
        (:func:`workers.stall.thread_stacks`; threads running user code first), for the
        diagnosis of an input stall."""
        return {"pid": _pid(), "threads": thread_stacks(skip={threading.get_ident()})}

    def stats(self) -> dict:
        with self._cond:
            return {"produced": self.produced, "buffered": len(self._buffer),
                    "buffered_bytes": self._buffer_bytes,
                    "next_index": self._next_index, "pid": _pid()}

    def pid(self) -> int:
        return _pid()

    def stop(self, join_s: float = 0.0) -> bool:
        """Stop producing; wait up to ``join_s`` for the producer thread to leave ``input_fn``
        (so that the process can then end without a thread inside native code). Returns
        whether the thread has ended."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._share.close()
        if join_s > 0:
            self._thread.join(join_s)
        return not self._thread.is_alive()


def _pid() -> int:
    import os

    return os.getpid()


_CONTROL = "control"
_DIAGNOSIS = "diagnosis"  # a thread of its own: it answers while a control call waits too


@ray.remote(concurrency_groups={_CONTROL: 1, _DIAGNOSIS: 1})
class InputWorker(InputWorkerImpl):
    """The Ray actor of one input worker (see :class:`InputWorkerImpl`). ``stats``, ``pid`` and
    the other control calls run in their own concurrency group, so they answer while ``fetch``
    calls wait for the producer; ``dump_stack`` and ``thread_stacks`` in another, so they
    answer while a producer is stuck in ``input_fn`` and a control call waits for it
    (``assignment_mode`` while the loader is built, ``stop``).

    Created with no arguments, the actor is a worker started ahead
    (:func:`workers.stream.start_workers_ahead`): its process starts and imports what the
    worker needs while the rest of the run starts; :meth:`setup`, with the arguments of
    :class:`InputWorkerImpl`, makes it an input worker, and must return before any other call.
    """

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            InputWorkerImpl.__init__(self, *args, **kwargs)

    @ray.method(concurrency_group=_CONTROL)
    def setup(self, *args, **kwargs) -> None:
        InputWorkerImpl.__init__(self, *args, **kwargs)

    @ray.method(concurrency_group=_DIAGNOSIS)
    def dump_stack(self) -> str:
        return InputWorkerImpl.dump_stack(self)

    @ray.method(concurrency_group=_DIAGNOSIS)
    def thread_stacks(self) -> dict:
        return InputWorkerImpl.thread_stacks(self)

    @ray.method(concurrency_group=_CONTROL)
    def stats(self) -> dict:
        return InputWorkerImpl.stats(self)

    @ray.method(concurrency_group=_CONTROL)
    def pid(self) -> int:
        return InputWorkerImpl.pid(self)

    @ray.method(concurrency_group=_CONTROL)
    def where(self) -> dict:
        """``{"node_id", "node_ip", "pid"}`` of this worker's process."""
        from workers.placement import where

        return where()

    @ray.method(concurrency_group=_CONTROL)
    def assign(self, send: int, numbers: list) -> None:
        return InputWorkerImpl.assign(self, send, numbers)

    @ray.method(concurrency_group=_CONTROL)
    def assignment_mode(self, timeout_s: float = 600.0) -> tuple:
        return InputWorkerImpl.assignment_mode(self, timeout_s)

    @ray.method(concurrency_group=_CONTROL)
    def worker_change_support(self, timeout_s: float = 600.0) -> tuple:
        return InputWorkerImpl.worker_change_support(self, timeout_s)

    @ray.method(concurrency_group=_CONTROL)
    def batches_per_epoch(self, timeout_s: float = 600.0) -> int | None:
        return InputWorkerImpl.batches_per_epoch(self, timeout_s)

    @ray.method(concurrency_group=_CONTROL)
    def stop(self, join_s: float = 0.0) -> bool:
        return InputWorkerImpl.stop(self, join_s)
