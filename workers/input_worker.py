"""One input node of the simulated Wafer-Scale Cluster: the :class:`InputWorker` Ray actor.

An ``InputWorker`` builds its dataloader by calling the user's ``input_fn`` as one worker of one
CS-X, then a background thread iterates it (cycling through epochs) into a small bounded buffer.
The consumer (:class:`workers.stream.CsxInputStream`) asks for batch ``k`` with ``fetch(k)`` (or
for batch ``k`` and up to ``n - 1`` ready ones after it in one reply with ``fetch(k, n)``); the
producer never runs more than ``capacity`` unfetched batches ahead, so memory stays bounded.

Every reply carries the worker's position right after that batch (epoch, batches within the
epoch, and the restartable loader's ``state_dict()`` when it has one), so the consumer always
knows the exact resume point of what it consumed, even after the actor died.

Tensors travel as numpy arrays (Ray moves those out of band, ~10x faster than pickled torch
tensors). The batches of one reply that share a structure travel as one array per leaf
(:func:`pack_columns`), and a reply is pickled whole (:class:`Reply`); :func:`unpack_reply`
rebuilds a reply's torch tensors once, each batch a view of them.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import warnings
from typing import Any

import numpy as np
import ray
import torch
from workers.torch_compat import tree_flatten, tree_map_only, tree_unflatten

from workers import environ
from workers.context import (BatchAssignment, DataLoaderCheckpoint, WorkerInfo, batch_assignment,
                             streamer_context, worker_context)
from workers.dataloader import DataLoader
from workers.duplicates import content_digest, sample_keys
from workers.errors import user_traceback
from workers.resume import Source, check_position, leading_dim, start_position
from workers.sharding import draws_ahead, dynamic_assignment_support, global_batches_per_epoch
from workers.stall import thread_stacks

# ---------------------------------------------------------------------------------------------
# Transport: torch tensors <-> numpy arrays
# ---------------------------------------------------------------------------------------------

_NUMPY_DTYPES = {
    torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
}


class PackedTensor:
    """A tensor in transit: a numpy array plus what is needed to rebuild the exact tensor.

    ``how`` is ``"numpy"`` (the array has the tensor's own dtype), ``"int16"`` (bfloat16 bits) or
    ``"bytes"`` (any other dtype, as raw uint8 bytes).
    """

    __slots__ = ("array", "dtype", "how", "shape")

    def __init__(self, array: np.ndarray, dtype: str, shape: tuple, how: str):
        self.array = array
        self.dtype = dtype
        self.shape = shape
        self.how = how

    def __reduce__(self):
        return (PackedTensor, (self.array, self.dtype, self.shape, self.how))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack_tensor(t: torch.Tensor) -> Any:
    """Turn a dense tensor into a :class:`PackedTensor` (other layouts travel as they are)."""
    if t.layout != torch.strided:
        return t
    # each step only where needed: every torch call here is paid once per batch leaf
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    shape = tuple(t.shape)
    if t.dtype in _NUMPY_DTYPES:
        return PackedTensor(t.numpy(), _dtype_name(t.dtype), shape, "numpy")
    if t.dtype == torch.bfloat16:
        return PackedTensor(t.view(torch.int16).numpy(), "bfloat16", shape, "int16")
    return PackedTensor(t.reshape(-1).view(torch.uint8).numpy(), _dtype_name(t.dtype), shape,
                        "bytes")


def unpack_tensor(p: PackedTensor, copy: bool = True) -> torch.Tensor:
    """Rebuild the tensor.

    ``copy=True``: on a private, writable copy of the received array (arrays received from Ray
    may be views of shared object-store memory, and an in-place op would change what other
    readers see). ``copy=False``: directly on the received memory -- for a consumer that is the
    object's only reader (an input stream: each batch object is fetched once), which saves a
    copy into freshly faulted pages (the dominant cost of large batches here).
    """
    if copy:
        t = torch.from_numpy(np.array(p.array, copy=True, order="C"))
    else:
        arr = np.asarray(p.array)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "array is not writable": sole reader
            t = torch.from_numpy(arr)
    if p.how == "numpy":
        return t
    dtype = getattr(torch, p.dtype)
    if p.how == "int16":
        return t.view(dtype)
    return t.view(dtype).reshape(p.shape)


def pack_batch(batch: Any) -> tuple[Any, int]:
    """The batch with every tensor replaced by a :class:`PackedTensor` (same nesting), and the
    packed bytes, in one walk of the batch."""
    if isinstance(batch, torch.Tensor):  # the common single-tensor batch: no pytree walk
        leaves, spec = [batch], None
    else:
        leaves, spec = tree_flatten(batch)
    packed, nbytes = [], 0
    for x in leaves:
        if isinstance(x, torch.Tensor):
            x = pack_tensor(x)
            nbytes += x.array.nbytes if isinstance(x, PackedTensor) else \
                x.numel() * x.element_size()
        packed.append(x)
    payload = packed[0] if spec is None else tree_unflatten(packed, spec)
    return payload, nbytes


def unpack_batch(payload: Any, copy: bool = True) -> Any:
    """Inverse of :func:`pack_batch` (see :func:`unpack_tensor` for ``copy``)."""
    if isinstance(payload, PackedTensor):
        return unpack_tensor(payload, copy)
    return tree_map_only(PackedTensor, lambda p: unpack_tensor(p, copy), payload)


def pack_columns(batches: list) -> Any | None:
    """Several batches of one structure as one payload: each tensor leaf holds that leaf of
    every batch, stacked along a new first dimension; each other leaf is the value all the
    batches share. None if the batches differ in structure, in a leaf's shape or dtype, or
    in a plain value, or hold a tensor that is not dense (they then travel one by one).

    One array per leaf and reply, not one per batch: the consumer deserializes and rebuilds
    a reply's tensors once (:func:`unpack_columns`) and takes each batch as views."""
    single = isinstance(batches[0], torch.Tensor)
    if single:
        columns, spec = [list(batches)], None
    else:
        leaves, spec = tree_flatten(batches[0])
        columns = [[x] for x in leaves]
        for b in batches[1:]:
            other, other_spec = tree_flatten(b)
            if other_spec != spec:
                return None
            for col, x in zip(columns, other):
                col.append(x)
    packed = []
    for col in columns:
        first = col[0]
        if isinstance(first, torch.Tensor):
            if first.layout != torch.strided or any(
                    not isinstance(t, torch.Tensor) or t.layout != torch.strided
                    or t.shape != first.shape or t.dtype != first.dtype
                    or t.device != first.device for t in col):
                return None
            packed.append(pack_tensor(torch.stack([t.detach() for t in col])))
        elif any(isinstance(x, torch.Tensor) or type(x) is not type(first) or x != first
                 for x in col):
            return None
        else:
            packed.append(first)
    return packed[0] if single else tree_unflatten(packed, spec)


def unpack_columns(payload: Any, n: int, copy: bool = True) -> list:
    """The ``n`` batches of a :func:`pack_columns` payload, each tensor a view of its
    column (see :func:`unpack_tensor` for ``copy``: one copy per column, not per batch)."""
    if isinstance(payload, PackedTensor):
        return list(unpack_tensor(payload, copy).unbind(0))
    leaves, spec = tree_flatten(payload)
    columns = [unpack_tensor(x, copy).unbind(0) if isinstance(x, PackedTensor) else (x,) * n
               for x in leaves]
    if type(payload) in (tuple, list) and spec.num_leaves == len(payload):  # flat: no pytree
        kind = type(payload)
        return [kind(col[i] for col in columns) for i in range(n)]
    return [tree_unflatten([col[i] for col in columns], spec) for i in range(n)]


def unpack_reply(reply: dict, copy: bool = True) -> list:
    """The items of a ``fetch`` reply, each batch item with its tensors rebuilt as
    ``item["batch"]`` (see :func:`unpack_tensor` for ``copy``)."""
    if reply["kind"] != "chunk":
        items = [reply]
    else:
        items = reply["items"]
        columns = reply.get("columns")
        if columns is not None:
            for item, batch in zip(items, unpack_columns(columns, len(items), copy)):
                item["batch"] = batch
            return items
    for item in items:
        if "payload" in item:
            item["batch"] = unpack_batch(item.pop("payload"), copy)
    return items


# ---------------------------------------------------------------------------------------------
# The actor
# ---------------------------------------------------------------------------------------------

def _error_reply(index: int, exc: BaseException, during: str) -> dict:
    return {
        "kind": "error",
        "index": index,
        "exc_type": type(exc).__name__,
        "exc_module": type(exc).__module__,
        "exc_message": str(exc),
        "traceback": user_traceback(exc),
        "during": during,
    }


def batch_nbytes(batch: Any) -> int:
    """Bytes of the tensors in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    leaves, _ = tree_flatten(batch)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


_REPLY_WAIT_S = 0.05
"""The longest a ``fetch`` with ``min_count > 1`` waits for those batches beyond the first."""


def _packed(item: dict) -> dict:
    """A produced item made ready to send: its batch as numpy-backed :class:`PackedTensor`s,
    its byte count, and (for a batch whose sample keys are asked for and whose sampler gave
    no sample ids) its content digest."""
    if item["kind"] != "batch" or "batch" not in item:
        return item
    item = dict(item)
    batch = item.pop("batch")
    try:
        payload, nbytes = pack_batch(batch)
    except BaseException as e:  # noqa: BLE001 (sent to the consumer)
        return _error_reply(item["index"], e, "while sending this batch (a batch must be a "
                            "nest of tensors and plain values)")
    item["payload"] = payload
    item["nbytes"] = nbytes
    keys = item.get("keys")
    if keys is not None and keys.get("ids") is None:
        item["keys"] = dict(keys, digest=content_digest(payload))
    return item


class Reply:
    """A ``fetch`` reply in transit, pickled whole. Ray would write a plain dict as
    msgpack, repeating per item every value the items share (a position's saved RNG state
    is kilobytes); pickle's memo sends a shared value once. Arrays still travel out of
    band."""

    __slots__ = ("body",)

    def __init__(self, body: dict):
        self.body = body

    def __reduce__(self):
        return (Reply, (self.body,))


def _chunk_reply(index: int, items: list) -> dict:
    """The reply for several produced items: their batches as columns
    (:func:`pack_columns`) where they are all batches of one structure, none asked for a
    content digest, else one payload each."""
    if len(items) > 1 and all(it["kind"] == "batch" and "batch" in it and (
            it.get("keys") is None or it["keys"].get("ids") is not None) for it in items):
        try:
            columns = pack_columns([it["batch"] for it in items])
        except Exception:  # noqa: BLE001 (a tensor torch cannot stack: sent one by one)
            columns = None
        if columns is not None:
            meta = []
            for it in items:
                it = dict(it)
                del it["batch"]
                meta.append(it)
            return {"kind": "chunk", "index": index, "items": meta, "columns": columns}
    return {"kind": "chunk", "index": index, "items": [_packed(it) for it in items]}


class InputWorkerImpl:
    """The body of the :data:`InputWorker` actor (usable in-process for debugging).

    Args:
        dataloader: the :class:`workers.dataloader.DataLoader` recipe.
        info: which worker of which CS-X this is.
        start: where to start: ``worker_step`` (batches this worker delivered before),
            ``samples_streamed`` and ``position`` (see :mod:`workers.resume`).
        capacity: the most batches produced but not yet fetched.
        capacity_bytes: the most bytes of batches produced but not yet fetched (at least one
            batch is always allowed); None: bounded in batches only.
        keys_until: batches with an index below this carry their sample keys (sample ids, or a
            content digest) for the duplicate check of :mod:`workers.duplicates`.
        owns_global_rng: the process runs nothing but this worker (a Ray actor), so torch's
            global RNG is the input pipeline's (see :class:`workers.resume.Source`).
        dynamic: ask for dynamic assignment: if the loader can take part
            (:func:`workers.sharding.dynamic_assignment_support`), the worker produces the
            global batches whose numbers :meth:`assign` gives it, starting from
            ``dynamic_start`` (a position as in ``start``; None: ``start``'s), and every batch
            carries its number as ``"step"``; otherwise it runs as without (round-robin).
            :meth:`assignment_mode` tells which, and how many numbers the loader draws ahead
            of the batch it yields (:func:`workers.sharding.draws_ahead`). Where it draws more
            than that (a prefetching sampler wrapper), a ``fetch`` that waits while the loader
            waits for a number with batches drawn and not yet produced replies
            ``{"kind": "need_numbers", "index": i, "drawn_ahead": n}`` instead of the batch
            (once for each new, larger ``n``): the coordinator then grants ``n`` numbers more
            and asks for batch ``i`` again.
    """

    def __init__(self, dataloader: DataLoader, info: WorkerInfo, start: dict | None = None,
                 capacity: int = 2, capacity_bytes: int | None = None, keys_until: int = 0,
                 owns_global_rng: bool = False, dynamic: bool = False,
                 dynamic_start: dict | None = None):
        start = dict(start or {})
        self.dynamic_requested = bool(dynamic)
        self._dynamic_start = dynamic_start
        self._assignment = BatchAssignment(self._wake) if dynamic else None
        self._reported_ahead = 0  # the largest drawn_ahead a need_numbers reply sent
        self._draws_ahead = 0
        self._mode: tuple[str, str] | None = None
        self._mode_known = threading.Event()
        self._batches_per_epoch: int | None = None  # dynamic: global batches of an epoch
        self.info = info
        self.dataloader = dataloader
        self.capacity = max(1, int(capacity))
        self.capacity_bytes = capacity_bytes
        self.keys_until = int(keys_until)
        self.owns_global_rng = owns_global_rng
        self.first_index = int(start.get("worker_step", 0))
        self._position = check_position(dict(start.get("position") or start_position()))
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
            appliance_step=self._appliance_step(self.first_index),
            worker_step=self.first_index, samples_streamed=int(start.get("samples_streamed", 0)),
            user_state_dict=self._position,
        )
        self._thread = threading.Thread(
            target=self._run, daemon=True,
            name=f"input-worker-csx{info.wse_id}-w{info.local_worker_id}")
        self._thread.start()

    def _appliance_step(self, worker_step: int) -> int:
        """The CS-X step count once this worker's ``worker_step`` batches were consumed."""
        if worker_step == 0:
            return 0
        return (worker_step - 1) * self.info.num_workers_per_csx + self.info.local_worker_id + 1

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
            self._error = _error_reply(self._next_index, exc, during)
            self._cond.notify_all()

    def _decide_mode(self, loader) -> None:
        """Dynamic assignment where asked for and the loader can take part, else static."""
        ok, why = dynamic_assignment_support(loader) if self.dynamic_requested else \
            (False, "static assignment was asked for")
        self._mode = ("dynamic" if ok else "static", why)
        if ok:
            self._draws_ahead = draws_ahead(loader)
            self._batches_per_epoch = global_batches_per_epoch(loader)
            if self._dynamic_start is not None:
                self._position = check_position(dict(self._dynamic_start))
                self.state.user_state_dict = self._position
        else:
            self._assignment = None
        self._mode_known.set()

    def _run(self) -> None:
        info = self.info
        environ.apply(getattr(self.dataloader, "worker_env", None))
        if self.owns_global_rng and self.dataloader.client_rng_state is not None:
            torch.set_rng_state(self.dataloader.client_rng_state)
        with worker_context(info, self.state), streamer_context():
            try:
                loader = self.dataloader.build(info)
                self._decide_mode(loader)
                source = Source(self.dataloader, loader, self._position,
                                owns_global_rng=self.owns_global_rng)
            except BaseException as e:  # noqa: BLE001 (sent to the consumer)
                if self._mode is None:
                    self._mode = ("failed", "")
                self._mode_known.set()
                self._fail(e, "while building its dataloader")
                return
            with batch_assignment(self._assignment):
                self._produce(source)

    def _produce(self, source: Source) -> None:
        assignment = self._assignment
        while not self._stop:
            index = self._next_index
            try:
                t0, t0_unix, t0_cpu = time.perf_counter(), time.time(), time.thread_time()
                idle0 = assignment.idle_s if assignment is not None else 0.0
                batch = next(source)
                if assignment is not None:  # waiting for a number is no part of the cost
                    idle = assignment.idle_s - idle0
                    t0 += idle
                    t0_unix += idle
                self.produced += 1
                st = self.state
                st.worker_step = index + 1
                number = assignment.pop_taken() if assignment is not None else None
                st.appliance_step = self._appliance_step(index + 1) if number is None \
                    else number + 1
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
                    "after": {
                        "worker_step": st.worker_step,
                        "samples_streamed": st.samples_streamed,
                        "user_state_dict": position,
                    },
                    "produce_s": time.perf_counter() - t0,
                    # wall-clock span of the production, for the run's timeline
                    "produced_unix": (t0_unix, time.time()),
                    "produce_cpu_s": time.thread_time() - t0_cpu,
                }
                if assignment is not None:
                    item["step"] = number
                    item["idle_s"] = idle  # waited for this batch's number
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
            return Reply(_packed(first))
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
        return Reply(_chunk_reply(index, items))

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
                ahead = self._assignment.waiting_ahead if self._assignment is not None else 0
                if ahead > self._reported_ahead:
                    self._reported_ahead = ahead
                    return {"kind": "need_numbers", "index": index, "drawn_ahead": ahead}
                if index < self._next_index and index not in self._buffer:
                    return _error_reply(index, RuntimeError(
                        f"batch {index} was already delivered or never requested in order"),
                        "(internal: duplicate fetch)")
                self._cond.wait(0.5)

    def assign(self, send: int, numbers: list) -> None:
        """Global batch numbers for this worker to produce, in increasing order (dynamic
        assignment); ``send`` numbers the calls 0, 1, 2, ... so they apply in order."""
        if self._assignment is not None:
            self._assignment.extend(send, numbers)

    def assignment_mode(self, timeout_s: float = 600.0) -> tuple[str, str, int]:
        """``(mode, why, draws_ahead)`` once the dataloader is built: ``"dynamic"`` or
        ``"static"`` (or ``"failed"``: building it raised, and ``fetch`` replies with the
        error), and the index batches the loader draws ahead of the one it yields."""
        if not self._mode_known.wait(timeout_s):
            return ("failed", f"the dataloader was not built within {timeout_s:.0f} s", 0)
        return (*(self._mode or ("failed", "")), self._draws_ahead)

    def batches_per_epoch(self, timeout_s: float = 600.0) -> int | None:
        """Under dynamic assignment, the global batches of an epoch (numbers ``e * n`` to
        ``e * n + n - 1`` are epoch ``e``'s), once the dataloader is built; else None."""
        self._mode_known.wait(timeout_s)
        return self._batches_per_epoch

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
        if self._assignment is not None:
            self._assignment.close()
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
    def batches_per_epoch(self, timeout_s: float = 600.0) -> int | None:
        return InputWorkerImpl.batches_per_epoch(self, timeout_s)

    @ray.method(concurrency_group=_CONTROL)
    def stop(self, join_s: float = 0.0) -> bool:
        return InputWorkerImpl.stop(self, join_s)
