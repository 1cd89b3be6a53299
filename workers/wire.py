"""The wire format of the input side: how batches and replies travel between processes.

Tensors travel as numpy arrays (Ray moves those out of band, ~10x faster than pickled torch
tensors): :func:`pack_tensor` / :func:`unpack_tensor`, :func:`pack_batch` / :func:`unpack_batch`
for a nest of them. The batches of one reply that share a structure travel as one array per
leaf (:func:`pack_columns`), and a reply is pickled whole (:class:`Reply`);
:func:`unpack_reply` rebuilds a reply's torch tensors once, each batch a view of them. The
input worker sends its replies in it, the stream reads them, and the wafer driver sends its
step outputs to the client with :func:`pack_tensor`.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np
import torch
from workers.torch_compat import tree_flatten, tree_map_only, tree_unflatten

from workers.errors import user_traceback

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


def leading_dim(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return int(batch[0].shape[0]) if batch[0].dim() else 1
    leaves, _ = tree_flatten(batch)
    for x in leaves:
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() else 1
    return 1



def error_reply(index: int, exc: BaseException, during: str) -> dict:
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


def packed_item(item: dict) -> dict:
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
        return error_reply(item["index"], e, "while sending this batch (a batch must be a "
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


def chunk_reply(index: int, items: list) -> dict:
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
    return {"kind": "chunk", "index": index, "items": [packed_item(it) for it in items]}



_DIGEST_SAMPLE_BYTES = 64 * 1024
_DIGEST_SAMPLES_PER_LEAF = 16


def content_digest(payload) -> str:
    """A digest of a packed batch: structure, dtypes, shapes, and up to 1 MiB of each leaf's
    bytes taken at evenly spaced places (equal batches always give equal digests; a 32 MiB
    batch is not hashed whole)."""
    leaves, spec = tree_flatten(payload)
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(spec).encode())
    for x in leaves:
        if isinstance(x, PackedTensor):
            h.update(f"{x.dtype}{x.shape}".encode())
            data = memoryview(np.ascontiguousarray(x.array)).cast("B")
            n = len(data)
            if n <= _DIGEST_SAMPLE_BYTES * _DIGEST_SAMPLES_PER_LEAF:
                h.update(data)
            else:
                stride = (n - _DIGEST_SAMPLE_BYTES) // (_DIGEST_SAMPLES_PER_LEAF - 1)
                for i in range(_DIGEST_SAMPLES_PER_LEAF):
                    h.update(data[i * stride:i * stride + _DIGEST_SAMPLE_BYTES])
        else:
            h.update(repr(x).encode())
    return h.hexdigest()
