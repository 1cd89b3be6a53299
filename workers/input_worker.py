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
tensors); :func:`unpack_batch` rebuilds torch tensors on memory the consumer owns.
"""

from __future__ import annotations

import copy
import warnings
import hashlib
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray
import torch
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

from workers.context import DataLoaderCheckpoint, WorkerInfo, worker_context
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.flow import FlowPolicy

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


_ATOMS = (int, float, str, bool, bytes, type(None))


def _copy_state(x: Any) -> Any:
    """A private copy of a loader state: fast for the usual dicts/lists of numbers and
    strings, ``copy.deepcopy`` for anything else."""
    if isinstance(x, _ATOMS):
        return x
    if type(x) is dict:
        return {k: _copy_state(v) for k, v in x.items()}
    if type(x) is list:
        return [_copy_state(v) for v in x]
    if type(x) is tuple:
        return tuple(_copy_state(v) for v in x)
    return copy.deepcopy(x)


def unpack_batch(payload: Any, copy: bool = True) -> Any:
    """Inverse of :func:`pack_batch` (see :func:`unpack_tensor` for ``copy``)."""
    return tree_map_only(PackedTensor, lambda p: unpack_tensor(p, copy), payload)


def batch_fingerprint(payload: Any) -> str:
    """A digest of a packed batch's structure, dtypes, shapes and bytes."""
    leaves, spec = tree_flatten(payload)
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(spec).encode())
    for x in leaves:
        if isinstance(x, PackedTensor):
            h.update(f"{x.dtype}{x.shape}".encode())
            h.update(memoryview(np.ascontiguousarray(x.array)).cast("B"))
        else:
            h.update(repr(x).encode())
    return h.hexdigest()


def _leading_dim(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return int(batch[0].shape[0]) if batch[0].dim() else 1
    leaves, _ = tree_flatten(batch)
    for x in leaves:
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() else 1
    return 1


# ---------------------------------------------------------------------------------------------
# Positions, epochs and restartable loaders
# ---------------------------------------------------------------------------------------------

def _candidates(loader) -> list:
    """The loader and the parts of it that may carry ``set_epoch`` / ``state_dict``."""
    objs = [loader]
    for name in ("batch_sampler", "sampler", "dataset"):
        objs.append(getattr(loader, name, None))
    bs = getattr(loader, "batch_sampler", None)
    objs.append(getattr(bs, "sampler", None))
    seen, out = set(), []
    for o in objs:
        if o is not None and id(o) not in seen:
            seen.add(id(o))
            out.append(o)
    return out


def restartable_part(loader):
    """``(name, object)`` of the first part of ``loader`` with ``state_dict`` and
    ``load_state_dict`` (the loader itself, its batch_sampler, sampler or dataset), or None."""
    names = {id(loader): "loader"}
    for name in ("batch_sampler", "sampler", "dataset"):
        o = getattr(loader, name, None)
        if o is not None:
            names.setdefault(id(o), name)
    bs = getattr(loader, "batch_sampler", None)
    if getattr(bs, "sampler", None) is not None:
        names.setdefault(id(bs.sampler), "batch_sampler.sampler")
    for o in _candidates(loader):
        if callable(getattr(o, "state_dict", None)) and callable(
                getattr(o, "load_state_dict", None)):
            return names.get(id(o), type(o).__name__), o
    return None


def set_epoch(loader, epoch: int) -> None:
    """Tell every part of ``loader`` that has ``set_epoch`` (sampler, batch_sampler, ...)."""
    for o in _candidates(loader):
        fn = getattr(o, "set_epoch", None)
        if callable(fn):
            fn(epoch)


_LEAN_ATTRS = ("_next_data", "_sampler_iter", "_num_yielded", "_dataset_kind",
               "_IterableDataset_len_called")


def _lean_iter(loader) -> Iterator:
    """``iter(loader)``; for a torch ``DataLoader`` with ``num_workers=0``, an iterator that takes
    the same steps as the loader's own ``__next__`` but leaves out its per-batch profiler
    annotation while no profiler runs. Entered fresh after each wait for data, that annotation
    costs ~0.15 ms a batch: as much as the rest of a worker's per-batch work."""
    it = iter(loader)
    if type(it) is not torch.utils.data.dataloader._SingleProcessDataLoaderIter or not all(
            hasattr(it, a) for a in _LEAN_ATTRS):
        return it
    return _LeanLoaderIter(it)


class _LeanLoaderIter:
    __slots__ = ("it",)

    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self

    def __next__(self):
        it = self.it
        if it._sampler_iter is None or it._IterableDataset_len_called is not None \
                or torch.autograd._profiler_enabled():
            return next(it)  # the loader's own path: reset, length warnings, profiling
        data = it._next_data()
        it._num_yielded += 1
        return data


class _Source:
    """Iterates a worker's loader forever from a position, tracking (epoch, batch in epoch).

    Starting at ``(epoch, batch_in_epoch)``: the epoch is announced with ``set_epoch``; a
    restartable loader is given the saved ``loader_state``; any other loader has the first
    ``batch_in_epoch`` batches of that epoch skipped. When an epoch ends the next one starts, as
    :func:`workers.dataloader.iterate_cycled` does; an epoch that yields nothing at all raises
    :class:`EmptyDataLoaderError`.
    """

    def __init__(self, dataloader: DataLoader, loader, epoch: int, batch_in_epoch: int,
                 loader_state: Any = None):
        self.dataloader = dataloader
        self.loader = loader
        self.epoch = epoch
        self.batch_in_epoch = batch_in_epoch
        self.restartable = restartable_part(loader)
        self._loader_state = loader_state
        self._it: Iterator | None = None

    def _empty(self) -> EmptyDataLoaderError:
        return EmptyDataLoaderError(
            f"input_fn {self.dataloader.input_fn_name} returned a dataloader that yields no "
            "batch" + (f" (epoch {self.epoch})" if self.epoch else "") + ". Check that the data "
            "set is not empty and that batch_size is not larger than the data set with "
            "drop_last=True (use a smaller batch_size or drop_last=False)."
        )

    def _start_epoch(self, resumed: bool) -> None:
        if self.epoch > 0:
            set_epoch(self.loader, self.epoch)
        skip = 0
        if resumed and self.batch_in_epoch:
            if self.restartable is not None and self._loader_state is not None:
                self.restartable[1].load_state_dict(copy.deepcopy(self._loader_state))
            else:
                skip, self.batch_in_epoch = self.batch_in_epoch, 0
        self._it = _lean_iter(self.loader)
        while skip:
            try:
                next(self._it)
            except StopIteration:
                # the epoch is shorter than the saved position: go on into the next epoch
                if self.batch_in_epoch == 0:
                    raise self._empty() from None
                self.epoch += 1
                self.batch_in_epoch = 0
                set_epoch(self.loader, self.epoch)
                self._it = _lean_iter(self.loader)
                continue
            self.batch_in_epoch += 1
            skip -= 1

    def __next__(self):
        if self._it is None:
            self._start_epoch(resumed=True)
        while True:
            try:
                batch = next(self._it)
            except StopIteration:
                if self.batch_in_epoch == 0:
                    raise self._empty() from None
                self.epoch += 1
                self.batch_in_epoch = 0
                self._start_epoch(resumed=False)
                continue
            self.batch_in_epoch += 1
            return batch

    def state(self) -> Any:
        """The restartable part's ``state_dict()`` now (a private copy), or None."""
        if self.restartable is None:
            return None
        return _copy_state(self.restartable[1].state_dict())


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
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "during": during,
    }


def _packed(item: dict) -> dict:
    """A produced item made ready to send: its batch as numpy-backed :class:`PackedTensor`s,
    its byte count, and (for the worker's first batch) its fingerprint."""
    if item["kind"] != "batch" or "batch" not in item:
        return item
    item = dict(item)
    batch = item.pop("batch")
    try:
        payload, nbytes = pack_batch(batch)
    except BaseException as e:  # noqa: BLE001 (sent to the consumer)
        return _error_reply(item["index"], e, f"while sending batch {item['index']} of this "
                            "worker (a batch must be a nest of tensors and plain values)")
    item["payload"] = payload
    item["nbytes"] = nbytes
    item["fingerprint"] = batch_fingerprint(payload) if item["index"] == 0 else None
    return item


class InputWorkerImpl:
    """The body of the :data:`InputWorker` actor (usable in-process for debugging).

    Args:
        dataloader: the :class:`workers.dataloader.DataLoader` recipe.
        info: which worker of which CS-X this is.
        start: where to start: ``worker_step`` (batches this worker delivered before),
            ``samples_streamed``, ``epoch``, ``batch_in_epoch`` and ``loader_state``.
        capacity: the most batches produced but not yet fetched.
        policy: the run's :class:`~workers.flow.FlowPolicy`; once the first batch is made, a
            worker whose batches are small holds ``policy.batches_per_reply(nbytes)`` of them,
            as many as one reply then carries.
    """

    def __init__(self, dataloader: DataLoader, info: WorkerInfo, start: dict | None = None,
                 capacity: int = 2, policy: FlowPolicy | None = None):
        start = dict(start or {})
        self.policy = policy
        self.info = info
        self.dataloader = dataloader
        self.capacity = max(1, int(capacity))
        self.first_index = int(start.get("worker_step", 0))
        self._start = start
        self._cond = threading.Condition()
        self._buffer: dict[int, dict] = {}
        self._next_index = self.first_index  # index of the next batch to produce
        self._error: dict | None = None
        self._stop = False
        self.produced = 0
        self.state = DataLoaderCheckpoint(
            local_worker_id=info.local_worker_id, num_workers_per_csx=info.num_workers_per_csx,
            num_csx=info.num_csx, wse_id=info.wse_id,
            appliance_step=self._appliance_step(self.first_index),
            worker_step=self.first_index, samples_streamed=int(start.get("samples_streamed", 0)),
            user_state_dict=self._position(int(start.get("epoch", 0)),
                                           int(start.get("batch_in_epoch", 0)),
                                           start.get("loader_state")),
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

    @staticmethod
    def _position(epoch: int, batch_in_epoch: int, loader_state: Any, part: str | None = None):
        pos = {"epoch": epoch, "batch_in_epoch": batch_in_epoch}
        if loader_state is not None:
            pos["loader_state"] = loader_state
            if part:
                pos["loader_state_of"] = part
        return pos

    # -- the producer thread ------------------------------------------------------------------
    def _put(self, item: dict) -> bool:
        with self._cond:
            while not self._stop and len(self._buffer) >= self.capacity:
                self._cond.wait()
            if self._stop:
                return False
            self._buffer[item["index"]] = item
            self._next_index = item["index"] + 1
            self._cond.notify_all()
            return True

    def _fail(self, exc: BaseException, during: str) -> None:
        with self._cond:
            self._error = _error_reply(self._next_index, exc, during)
            self._cond.notify_all()

    def _run(self) -> None:
        info, start = self.info, self._start
        with worker_context(info, self.state):
            try:
                loader = self.dataloader.build(info)
                source = _Source(self.dataloader, loader, int(start.get("epoch", 0)),
                                 int(start.get("batch_in_epoch", 0)), start.get("loader_state"))
            except BaseException as e:  # noqa: BLE001 (sent to the consumer)
                self._fail(e, "while building its dataloader")
                return
            part = source.restartable[0] if source.restartable else None
            while not self._stop:
                index = self._next_index
                try:
                    t0, t0_unix, t0_cpu = time.perf_counter(), time.time(), time.thread_time()
                    batch = next(source)
                    self.produced += 1
                    st = self.state
                    st.worker_step = index + 1
                    st.appliance_step = self._appliance_step(index + 1)
                    st.samples_streamed += _leading_dim(batch)
                    # a fresh dict each batch, never changed after: the reply and the worker's
                    # state share it
                    position = self._position(source.epoch, source.batch_in_epoch,
                                              source.state(), part)
                    st.user_state_dict = position
                    # packed by the fetch call that sends it, off the producer's path
                    item = {
                        "kind": "batch",
                        "index": index,
                        "batch": batch,
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
                except BaseException as e:  # noqa: BLE001 (sent to the consumer)
                    self._fail(e, f"while producing batch {index} of this worker")
                    return
                if self.produced == 1 and self.policy is not None:
                    nbytes = sum(t.numel() * t.element_size() for t in tree_flatten(batch)[0]
                                 if isinstance(t, torch.Tensor))
                    with self._cond:
                        self.capacity = max(self.capacity, self.policy.batches_per_reply(nbytes))
                del batch
                if not self._put(item):
                    return

    # -- remote methods -----------------------------------------------------------------------
    def fetch(self, index: int, count: int = 1) -> dict:
        """Batch ``index`` of this worker (waits for it), or an error reply.

        With ``count > 1``: a ``"chunk"`` reply holding batch ``index`` (waited for) and those
        after it that are already produced, at most ``count`` items in all (an error item ends
        the chunk). One reply for several batches pays Ray's per-call and per-object costs
        once, and never delays a batch that is ready.
        """
        first = self._take(index)
        if count == 1:
            return _packed(first)
        items = [first]
        with self._cond:
            i = index + 1
            while first["kind"] != "error" and len(items) < count:
                item = self._buffer.pop(i, None)
                if item is None:
                    if self._error is not None and self._error["index"] == i:
                        items.append(self._error)
                    break
                items.append(item)
                i += 1
            self._cond.notify_all()
        return {"kind": "chunk", "index": index, "items": [_packed(it) for it in items]}

    def _take(self, index: int) -> dict:
        with self._cond:
            while True:
                item = self._buffer.pop(index, None)
                if item is not None:
                    self._cond.notify_all()
                    return item
                if self._error is not None and index >= self._error["index"]:
                    return self._error
                if index < self._next_index and index not in self._buffer:
                    return _error_reply(index, RuntimeError(
                        f"batch {index} was already delivered or never requested in order"),
                        "(internal: duplicate fetch)")
                self._cond.wait(0.5)

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

    def stats(self) -> dict:
        with self._cond:
            return {"produced": self.produced, "buffered": len(self._buffer),
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
        if join_s > 0:
            self._thread.join(join_s)
        return not self._thread.is_alive()


def _pid() -> int:
    import os

    return os.getpid()


_CONTROL = "control"


@ray.remote(concurrency_groups={_CONTROL: 1})
class InputWorker(InputWorkerImpl):
    """The Ray actor of one input worker (see :class:`InputWorkerImpl`). ``dump_stack``,
    ``stats`` and ``pid`` run in their own concurrency group, so they answer while ``fetch``
    calls wait for the producer."""

    @ray.method(concurrency_group=_CONTROL)
    def dump_stack(self) -> str:
        return InputWorkerImpl.dump_stack(self)

    @ray.method(concurrency_group=_CONTROL)
    def stats(self) -> dict:
        return InputWorkerImpl.stats(self)

    @ray.method(concurrency_group=_CONTROL)
    def pid(self) -> int:
        return InputWorkerImpl.pid(self)

    @ray.method(concurrency_group=_CONTROL)
    def stop(self, join_s: float = 0.0) -> bool:
        return InputWorkerImpl.stop(self, join_s)
