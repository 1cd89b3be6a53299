"""The checkpoint layout of ``cerebras.pytorch`` 2.x ("0.5"): what :func:`cstream.save` writes.

The saved object is flattened the way ``torch.utils._pytree`` flattens it: containers (dict,
OrderedDict, list, tuple) form a tree spec and every other value is a leaf named by its dotted key
path (``model.fc.weight``, ``optimizer.state.0.exp_avg``, ``optimizer.param_groups.0.lr``). The
HDF5 file holds:

* root attributes ``__version__ = 0.5``, ``__cstorch_version__`` (the writer), ``__SUCCESS__ =
  True``, and ``__spec__``: the JSON text ``[unflattened, treespec]`` where ``treespec`` is
  ``torch.utils._pytree.treespec_dumps``'s JSON (protocol 1) of the tree;
* for every leaf ``K`` a root attribute ``K.__metadata__``: JSON with the leaf's own spec
  (``{K: leaf}``), ``__objects__`` and ``K.__metadata__``, the serializer's metadata:
  ``TorchTensorSerializer`` (``shapes``, ``dtypes`` like ``"torch.bfloat16"``, ``rtfx_dtypes``),
  ``ScalarSerializer`` (``scalar_value``), ``StringSerializer`` (``string_value``),
  ``NoneSerializer``, ``LinkedObject`` (``key`` of the leaf it is tied to) or ``ObjectSerializer``;
* a dataset per tensor, named ``K``, holding its values (bfloat16 as int16 bits, as the real package
  stores it), with the attributes ``__NUMPY__`` (which the real package's reader needs) and
  ``dtypes``; the real package copies all of the metadata there. cstream's files of before
  :func:`cstream.checkpoint.guard.seal` also hold ``cstream.crc32`` (the CRC-32 of the values),
  checked when such a tensor is read. A key HDF5 cannot use as a name (``/``, ``%``, control
  characters, ``""``, ``.``) is stored under ``%`` + its percent-encoding, named by the
  metadata's ``key``, which the real package follows. Numbers, strings and ``None`` live in the metadata only;
* for ``bytes``, ``complex`` and ``torch.dtype`` values (``ObjectSerializer``) an empty dataset whose
  ``__BYTES__`` attribute is a pickle; :mod:`cstream.checkpoint.safe_pickle` reads it without running code.

Like the real package (its ``H5Writer``), :func:`write` stores every tensor but 0-d ones through
HDF5's LZ4 filter (32004, ``hdf5plugin.LZ4()``: its default block size) in the chunks h5py picks
(``chunks=True``), so files are the real package's size; ``compress=False`` stores them contiguous
and uncompressed instead, which a reader maps into memory without a copy. HDF5 decodes LZ4 through
``hdf5plugin``'s filter. Tensors are read when first touched.
"""

from __future__ import annotations

import json
import math
import mmap
import pickle
import urllib.parse
from collections.abc import Mapping
from typing import Any

import h5py
import hdf5plugin  # registers HDF5's LZ4 filter (and its others) with h5py's HDF5
import numpy as np
import torch

from cstream.checkpoint import safe_pickle
from cstream.checkpoint.host_memory import host_array
from cstream.checkpoint.lazy import CheckpointError, Lazy, LazyDict, real
from cstream.checkpoint.guard import crc32

VERSION = 0.5
SUPPORTED = ("torch.Tensor, dict (str or int keys), list, tuple, str, int, float, bool, None, "
             "and (pickled, as cerebras.pytorch does) bytes, complex and torch.dtype")
LEAF = {"type": None, "context": None, "children_spec": []}
_CONTAINERS = {"builtins.dict": dict, "collections.OrderedDict": dict, "builtins.list": list,
               "builtins.tuple": tuple, "builtins.set": set}
# the real package's RtFx dtype numbers (cerebras.appliance.data.conversions)
_RTFX = {torch.bool: 1, torch.int16: 3, torch.int32: 4, torch.int64: 5, torch.uint8: 6,
         torch.uint16: 7, torch.float16: 10, torch.float32: 11, torch.float64: 12, torch.bfloat16: 15}
# dtypes numpy lacks, stored as integers of the same width (bfloat16 as int16, as the real package)
_BITS = {torch.bfloat16: np.int16, torch.complex32: np.uint32}
_BITS.update({d: np.uint8 for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2")) if d is not None})
_NUMPY = [torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool,
          torch.complex64, torch.complex128]
DTYPES = {str(d): d for d in [*_NUMPY, *_BITS]}
LZ4_FILTER = hdf5plugin.LZ4.filter_id  # 32004
_MAX_COMPRESSION = 256
# what h5py raises on a damaged file (HDF5's own checksums and structure checks fail)
_H5_ERRORS = (OSError, RuntimeError, KeyError, TypeError, ValueError)


def one(value):
    """An attribute's value if it is a single value, else None (a damaged file's attribute can
    turn into an array)."""
    return value if np.ndim(value) == 0 else None


def where_of(path: str, key) -> str:
    """``model/weight``, ``state[0]``: how errors and ``cstream ckpt inspect`` name an entry."""
    if isinstance(key, str):
        return f"{path}/{key}" if path else key
    return f"{path}[{key}]"


def _dumps_spec(schema: dict) -> str:
    return json.dumps([1, schema])


def _dataset_name(key: str) -> str:
    """``key`` itself where HDF5 can name a dataset so, else ``%`` + its percent-encoding."""
    if key in ("", ".", "..") or any(c in "/%" or ord(c) < 32 for c in key):
        return "%" + urllib.parse.quote(key.encode("utf-8"), safe="")
    return key


# -- writing ------------------------------------------------------------------------------------
class _Flattener:
    """Walks the object once: the tree spec (JSON schema), and the leaves with their dotted keys."""

    def __init__(self):
        self.leaves: list[tuple[str, str, Any]] = []  # (dotted key, where, value)
        self.where_of_key: dict[str, str] = {}

    def visit(self, value, parts: list[str], where: str):
        if isinstance(value, torch.Tensor) or value is None or isinstance(
                value, (bool, int, float, str)) or safe_pickle.is_admitted(value):
            return self.leaf(value, parts, where)
        if isinstance(value, Mapping):
            for k in value:
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise TypeError(
                        f"cstream.save cannot store the key {k!r} ({type(k).__name__}) in the dict "
                        f"at {where or '/'}: dict keys must be str or int. Convert the key, e.g. "
                        "with str().")
            children = [self.visit(value[k], [*parts, str(k)], where_of(where, k)) for k in value]
            kind = ("collections.OrderedDict" if type(value).__name__ == "OrderedDict"
                    else "builtins.dict")
            return {"type": kind, "context": json.dumps([k if isinstance(k, str) else int(k)
                                                          for k in value]),
                    "children_spec": children}
        if isinstance(value, (list, tuple)):
            kind = "builtins.tuple" if isinstance(value, tuple) else "builtins.list"
            return {"type": kind, "context": "null",
                    "children_spec": [self.visit(v, [*parts, str(i)], f"{where}[{i}]")
                                      for i, v in enumerate(value)]}
        raise TypeError(
            f"cstream.save cannot store {type(value).__name__} at {where or '/'}: checkpoints hold "
            f"{SUPPORTED}. Convert it first, e.g. to a tensor, a dict or a string.")

    def leaf(self, value, parts: list[str], where: str) -> dict:
        key = ".".join(parts)
        if key in self.where_of_key:
            raise ValueError(
                f"cstream.save cannot store both {self.where_of_key[key] or '/'} and {where}: the "
                f"checkpoint layout names every value by its dotted key path and both are {key!r}. "
                "Rename one of the keys so that their dotted paths differ.")
        if any(0xD800 <= ord(c) <= 0xDFFF or c == "\0" for c in key):
            raise ValueError(
                f"cstream.save cannot store the value at {where}: its key path {key!r} holds a NUL "
                "or a lone surrogate, which HDF5 attribute names cannot hold. Rename the key.")
        self.where_of_key[key] = where
        self.leaves.append((key, where, value))
        return LEAF


def _check_tensor(t: torch.Tensor, where: str) -> None:
    """Refuse what the layout cannot store, before any of the file is written."""
    where = where or "/"
    if t.layout != torch.strided:
        raise TypeError(f"cstream.save cannot store the {t.layout} tensor at {where}: only dense "
                        "tensors are stored. Convert it first with .to_dense().")
    if t.dtype not in DTYPES.values():
        raise TypeError(f"cstream.save cannot store the {t.dtype} tensor at {where}: supported dtypes "
                        f"are {', '.join(sorted(n[6:] for n in DTYPES))}. Convert it first, e.g. "
                        "with .dequantize() or .float().")
    if t.device.type == "meta":
        raise TypeError(f"cstream.save cannot store the tensor at {where}: it is on the meta device "
                        "and has no values. Materialise it (e.g. load or initialise the model's "
                        "weights) before saving.")


def _tensor_array(t: torch.Tensor) -> np.ndarray:
    t = t.detach().to("cpu").contiguous()
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    if t.dtype in _BITS:
        stored = np.dtype(_BITS[t.dtype])
        signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[stored.itemsize]
        return t.view(signed).numpy().view(stored)
    return t.numpy()


def _tensor_metadata(t: torch.Tensor) -> dict:
    meta = {"__TORCH__": True, "shapes": [list(t.shape)], "dtypes": [str(t.dtype)]}
    if t.dtype in _RTFX:
        meta["rtfx_dtypes"] = [_RTFX[t.dtype]]
    meta.update({"__TYPE__": "TorchTensorSerializer", "__NUMPY__": True, "compressed": False})
    return meta


def _write_leaf(f: h5py.File, key: str, where: str, value, first_of: dict, compress: bool) -> dict:
    """Writes one leaf's dataset (if it has one) and returns its serializer metadata."""
    if isinstance(value, torch.Tensor):
        if id(value) in first_of:  # the same tensor again (tied weights): a link, as cstorch writes
            return {"key": first_of[id(value)], "__LINKED__": True, "__TYPE__": "LinkedObject",
                    "__NONE__": True}
        first_of[id(value)] = key
        array = _tensor_array(value)
        meta = _tensor_metadata(value)
        name = _dataset_name(key)
        if name != key:
            meta["key"] = name
        # as the real package's H5Writer: LZ4 in h5py's chunks for all but 0-d tensors
        filters = {"chunks": True, **hdf5plugin.LZ4()} if compress and array.ndim else {}
        ds = f.create_dataset(name, data=array, **filters)
        # the reader of the real package needs __NUMPY__ here (the rest of the metadata is in the
        # root attribute; each attribute costs ~0.1 ms, so a model's thousands add up)
        ds.attrs["__NUMPY__"] = True
        ds.attrs["dtypes"] = meta["dtypes"]
        return meta
    if isinstance(value, (bool, int, float)):
        return {"scalar_value": value, "__TYPE__": "ScalarSerializer", "__NONE__": True}
    if isinstance(value, str):
        return {"string_value": value, "__TYPE__": "StringSerializer", "__NONE__": True}
    if value is None:
        return {"__TYPE__": "NoneSerializer", "__NONE__": True}
    meta = {"__TYPE__": "ObjectSerializer", "__BYTES__": True, "compressed": False}
    name = _dataset_name(key)
    if name != key:
        meta["key"] = name
    ds = f.create_dataset(name, data=h5py.Empty("f"), track_order=True)
    ds.attrs.update(meta)
    data = safe_pickle.dumps(bytes(value) if isinstance(value, bytearray) else value)
    ds.attrs["__BYTES__"] = np.frombuffer(data, dtype="V1")  # as the real package stores it
    return meta


def _unflattened(schema: dict, values: list):
    """The real package's human-readable copy of the spec: the tree with ``"*"`` for every leaf."""
    if schema["type"] is None:
        return "*"
    children = [_unflattened(c, values) for c in schema["children_spec"]]
    if schema["type"] in ("builtins.dict", "collections.OrderedDict"):
        return dict(zip(json.loads(schema["context"]), children))
    return children


def write(obj, path, writer: str, userblock_size: int = 0, compress: bool = True) -> None:
    """Write ``obj`` to the new file ``path`` in the real package's layout, after an empty user
    block of ``userblock_size`` bytes (0, or a power of 2 from 512) that HDF5 leaves to its caller;
    tensors LZ4-compressed as the real package writes them, or contiguous if not ``compress``."""
    flat = _Flattener()
    schema = flat.visit(obj, [], "")
    for key, where, value in flat.leaves:
        if isinstance(value, torch.Tensor):
            _check_tensor(value, where)
    unflattened = _unflattened(schema, [])
    try:
        spec_text = json.dumps([unflattened, _dumps_spec(schema)], indent=4)
    except (TypeError, ValueError):
        spec_text = json.dumps([None, _dumps_spec(schema)], indent=4)
    # uncompressed tensors from 4 KiB start at multiples of 64 bytes: mapped, they are aligned
    aligned = {} if compress else {"alignment_threshold": 4096, "alignment_interval": 64}
    with h5py.File(path, "w", libver=("v108", "v110"), userblock_size=userblock_size,
                   **aligned) as f:
        f.attrs["__spec__"] = spec_text
        f.attrs["__version__"] = np.float64(VERSION)
        f.attrs["__cstorch_version__"] = writer
        first_of: dict[int, str] = {}
        for key, where, value in flat.leaves:
            meta = _write_leaf(f, key, where, value, first_of, compress)
            f.attrs[f"{key}.__metadata__"] = json.dumps({
                "__spec__": [{key: "*"}, _dumps_spec({"type": "builtins.dict",
                                                      "context": json.dumps([key]),
                                                      "children_spec": [LEAF]})],
                "__objects__": [key],
                f"{key}.__metadata__": meta,
            }, indent=4)
        f.attrs["__SUCCESS__"] = np.bool_(True)


# -- reading ------------------------------------------------------------------------------------
class _Node:
    """One node of a parsed tree spec: its container type (None for a leaf), keys and children."""

    __slots__ = ("kind", "keys", "children")

    def __init__(self, kind, keys, children):
        self.kind, self.keys, self.children = kind, keys, children


def unreadable(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path} is not a readable checkpoint: {what}.")


class H5Checkpoint:
    """An open checkpoint in the real package's layout: its spec, leaves, and the file lazy tensors
    are read from. :func:`cstream.checkpoint.opener.open_checkpoint` opens the file, reads its root
    attributes and layout version, and makes the reader of that version (this class for 0.5)."""

    def __init__(self, path: str, file: h5py.File, attrs: dict, version: float):
        self.path, self.file, self.attrs, self.version = path, file, attrs, version
        self.mapped: mmap.mmap | None = None  # the file in memory, for contiguous datasets
        self._check_root()
        self.tree = self._read_tree()

    def error(self, what: str) -> CheckpointError:
        return unreadable(self.path, what)

    @property
    def writer(self) -> str:
        """``__cstorch_version__``: the real package's release ("2.10.0"), or "cstream 0.1.0"."""
        return str(self.attrs.get("__cstorch_version__", "an unknown program"))

    @property
    def layout(self) -> str:
        """The layout and its writer, in words (:func:`cstream.checkpoint.saving.layout`)."""
        writer = self.writer if self.writer.startswith("cstream") else f"cerebras.pytorch {self.writer}"
        return f"cerebras.pytorch layout {self.version}, written by {writer}"

    def _check_root(self) -> None:
        if not one(self.attrs.get("__SUCCESS__", False)):
            raise self.error("it was not written to the end (no __SUCCESS__ attribute); the program "
                             "that saved it stopped while saving")

    def _json(self, name: str):
        text = self.attrs.get(name)
        if not isinstance(text, str):
            raise self.error(f"its attribute {name} is missing or not text")
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            raise self.error(f"its attribute {name} is not valid JSON ({e})") from e

    def _read_tree(self) -> _Node:
        return self._parse(self._spec_schema(), "/")

    def _spec_schema(self) -> dict:
        spec = self._json("__spec__")
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], str)):
            raise self.error("its __spec__ is not [unflattened, treespec]")
        try:
            protocol, schema = json.loads(spec[1])
        except (ValueError, TypeError, RecursionError) as e:
            raise self.error(f"its tree spec cannot be parsed ({e})") from e
        if protocol != 1:
            raise self.error(f"its tree spec has protocol {protocol!r}; cstream reads protocol 1")
        return schema

    def _parse(self, schema, where: str) -> _Node:
        if not (isinstance(schema, dict) and isinstance(schema.get("children_spec"), list)):
            raise self.error(f"its tree spec is malformed at {where}")
        kind = schema.get("type")
        if kind is None:
            return _Node(None, None, [])
        if kind not in _CONTAINERS:
            raise self.error(f"its tree spec holds a {kind} at {where}; cstream reads "
                             f"{', '.join(_CONTAINERS)}")
        keys = None
        if _CONTAINERS[kind] is dict:
            try:
                keys = json.loads(schema.get("context"))
            except (TypeError, ValueError) as e:
                raise self.error(f"the keys of the dict at {where} cannot be parsed") from e
            if not (isinstance(keys, list) and len(keys) == len(schema["children_spec"])
                    and all(type(k) in (str, int) for k in keys)):
                raise self.error(f"the keys of the dict at {where} are malformed")
        labels = keys if keys is not None else range(len(schema["children_spec"]))
        return _Node(kind, keys, [self._parse(c, where_of("" if where == "/" else where, k))
                                  for k, c in zip(labels, schema["children_spec"])])

    # leaves: each is read from its K.__metadata__ attribute
    def leaf_metadata(self, key: str, where: str) -> dict:
        m = self._json(f"{key}.__metadata__")
        meta = m.get(f"{key}.__metadata__") if isinstance(m, dict) else None
        if not isinstance(meta, dict) or key not in m.get("__objects__", []):
            kinds = sorted({v.get("__TYPE__") for v in m.values() if isinstance(v, dict)} - {None}) \
                if isinstance(m, dict) else []
            raise self.error(f"the entry {where} is stored by the serializers {kinds} as a nested "
                             "object, which cstream does not read (it reads tensors, numbers, "
                             "strings, None, tied tensors and pickled plain values)")
        return meta

    def dataset(self, meta: dict, key: str, where: str):
        return self.open_dataset(meta.get("key", key), where)

    def open_dataset(self, name: str, where: str) -> h5py.Dataset:
        try:
            ds = self.file[name]
        except _H5_ERRORS as e:
            raise self.error(f"the dataset {name!r} of the entry {where} cannot be opened") from e
        if not isinstance(ds, h5py.Dataset):
            raise self.error(f"the entry {where} is stored in {name!r}, which is not a dataset "
                             f"but a {type(ds).__name__}")
        return ds

    def tensor_info(self, meta: dict, where: str) -> tuple[torch.dtype, tuple]:
        dtypes, shapes = meta.get("dtypes"), meta.get("shapes")
        if not (isinstance(dtypes, list) and dtypes and dtypes[0] in DTYPES):
            raise self.error(f"the tensor {where} has the unknown dtype {dtypes!r}")
        if not (isinstance(shapes, list) and shapes and isinstance(shapes[0], list)
                and all(type(s) is int and s >= 0 for s in shapes[0])):
            raise self.error(f"the tensor {where} has a malformed shape {shapes!r}")
        return DTYPES[dtypes[0]], tuple(shapes[0])

    def read_tensor(self, name: str, dtype: torch.dtype, shape: tuple, where: str,
                    device) -> torch.Tensor:
        """The tensor in the dataset ``name``, checked against its dtype, shape and CRC-32."""
        want = np.dtype(_BITS[dtype]) if dtype in _BITS else torch.empty(0, dtype=dtype).numpy().dtype
        ds = self.open_dataset(name, where)
        try:
            stored = (ds.dtype, ds.shape)
            # checked before the values are read: a damaged file's shape could be any size
            if stored[1] != shape or stored[0].itemsize != want.itemsize or stored[0].kind not in "iufbc":
                raise self.error(f"the tensor {where} is stored as {stored[0]} {stored[1]}, not as "
                                 f"its {str(dtype)[6:]} {shape}")
            self.check_storage(ds, where)
            array = self._values(ds)
            crc = ds.attrs.get("cstream.crc32")
            if crc is not None and not (np.ndim(crc) == 0 and isinstance(crc, (int, np.integer))):
                raise self.error(f"the checksum attribute of the tensor {where} is damaged")
        except _H5_ERRORS as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{self.path}: the tensor {where} cannot be read: "
                                  f"{' '.join(str(e).split())}") from e
        if crc is not None and crc32(array.reshape(-1).view(np.uint8)) != int(crc):
            raise CheckpointError(f"{self.path}: the tensor {where} is corrupted: its data does not "
                                  "match its checksum.")
        array = array.view(want) if array.dtype != want else array
        t = torch.from_numpy(array)
        if dtype in _BITS:
            t = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[want.itemsize]).view(dtype)
        return device(t) if device is not None else t

    def check_storage(self, ds: h5py.Dataset, where: str) -> None:
        """Refuse a dataset whose shape claims far more bytes than the file stores for it (a
        damaged shape), before memory for its values is taken."""
        nbytes = math.prod(ds.shape) * ds.dtype.itemsize
        stored = ds.id.get_storage_size()
        filtered = ds.id.get_create_plist().get_nfilters() > 0
        # LZ4 (the real package's filter) shrinks data at most 255-fold
        if nbytes > (_MAX_COMPRESSION * stored + (1 << 20) if filtered else stored):
            raise self.error(f"the entry {where} has the shape {ds.shape} ({nbytes} bytes), but the "
                             f"file stores {stored} bytes for it")

    def _values(self, ds: h5py.Dataset) -> np.ndarray:
        """The dataset's values, in this machine's byte order (HDF5 stores either). A contiguous,
        unfiltered dataset is a view of the file mapped into memory (copy-on-write: changing the
        tensor leaves the file as it is), read by the first touch of each page; any other is read
        by HDF5 (through its filters, chunk by chunk) straight into the array returned."""
        dtype = ds.dtype
        if dtype.isnative and ds.size:
            offset = ds.id.get_offset()  # None unless the values lie contiguous in the file
            if offset is not None and offset % dtype.alignment == 0:
                mapped = self._mapped()
                if offset + ds.size * dtype.itemsize > len(mapped):
                    raise self.error(f"the dataset {ds.name!r} lies past the end of the file")
                return np.frombuffer(mapped, dtype, ds.size, offset).reshape(ds.shape)
        values = host_array(ds.shape, dtype)
        if values.size:
            ds.read_direct(values)
        return values if dtype.isnative else values.astype(dtype.newbyteorder("="))

    def _mapped(self) -> mmap.mmap:
        if self.mapped is None:
            with open(self.path, "rb") as f:
                self.mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self.mapped

    def read_object(self, meta: dict, key: str, where: str):
        ds = self.dataset(meta, key, where)
        try:
            raw = ds.attrs.get("__BYTES__")
        except _H5_ERRORS as e:
            raise self.error(f"the attributes of the entry {where} cannot be read") from e
        if not (isinstance(raw, (np.void, np.ndarray)) and raw.dtype.kind == "V"):
            raise self.error(f"the entry {where} has no pickled bytes (__BYTES__)")
        return self.unpickle(np.asarray(raw).tobytes(), where)

    def unpickle(self, data: bytes, where: str):
        """A pickled value, read by :func:`cstream.checkpoint.safe_pickle.loads` (no code from the file
        runs)."""
        try:
            return safe_pickle.loads(data)
        except safe_pickle.UnsafePickleError as e:
            raise CheckpointError(
                f"{self.path}: the entry {where} is a pickled object that names {e.name}, which "
                f"cstream refuses to load: it unpickles only {safe_pickle.ADMITTED}, so that "
                "loading a file never runs code from it. If you trust the file, load it with "
                "cerebras.pytorch.load and save the value as a tensor, number or string.") from e
        except pickle.UnpicklingError as e:  # any damage (see safe_pickle._load)
            raise self.error(f"the pickled entry {where} is malformed ({type(e).__name__}: {e})") from e

    def leaf_value(self, key: str, where: str, device, links: dict):
        """A leaf's value: read at once for plain values, a :class:`Lazy` for tensors.

        ``links`` maps the dotted keys read so far to their values: the real package saves a value
        seen before under another key (the same object: tied weights, but also the same small
        int) as a ``LinkedObject`` to that key, and it loads as that very value.
        """
        meta = self.leaf_metadata(key, where)
        kind = meta.get("__TYPE__")
        if kind == "LinkedObject" and type(meta.get("key")) is str:
            if meta["key"] not in links:
                raise self.error(f"the entry {where} is tied to {meta['key']!r}, which is not an "
                                 "entry saved before it")
            return links[meta["key"]]
        if kind == "TorchTensorSerializer" and meta.get("__NUMPY__"):
            dtype, shape = self.tensor_info(meta, where)
            name = meta.get("key", key)
            value = Lazy(lambda: self.read_tensor(name, dtype, shape, where, device), dtype, shape)
        elif kind == "ScalarSerializer" and type(meta.get("scalar_value")) in (bool, int, float):
            value = meta["scalar_value"]
        elif kind == "StringSerializer" and type(meta.get("string_value")) is str:
            value = meta["string_value"]
        elif kind == "NoneSerializer":
            value = None
        elif kind == "ObjectSerializer":
            value = self.read_object(meta, key, where)
        else:
            raise self.error(f"the entry {where} was saved by cerebras.pytorch's {kind}, which "
                             "cstream does not read (it reads tensors, numbers, strings, None, tied "
                             "entries and pickled plain values)")
        links[key] = value
        return value

    def build(self, node: _Node, parts: list[str], where: str, device, links: dict):
        if node.kind is None:
            return self.leaf_value(".".join(parts), where or "/", device, links)
        container = _CONTAINERS[node.kind]
        if container is dict:
            out = LazyDict()
            for k, child in zip(node.keys, node.children):
                out[k] = self.build(child, [*parts, str(k)], where_of(where, k), device, links)
            return out
        items = [real(self.build(child, [*parts, str(i)], f"{where}[{i}]", device, links))
                 for i, child in enumerate(node.children)]
        return container(items)

    def load(self, device):
        try:
            return real(self.build(self.tree, [], "", device, {}))
        except RecursionError as e:
            raise self.error("its structure is nested too deeply") from e

    def describe(self) -> list[dict]:
        out: list[dict] = []
        links: dict = {}

        def walk(node: _Node, parts: list[str], where: str):
            if node.kind is None:
                key = ".".join(parts)
                value = self.leaf_value(key, where or "/", None, links)  # tensors are not read
                if isinstance(value, Lazy):
                    size = torch.empty(0, dtype=value.dtype).element_size()
                    out.append({"key": where or "/", "type": "tensor", "dtype": str(value.dtype)[6:],
                                "shape": value.shape,
                                "nbytes": int(np.prod(value.shape, dtype=np.int64)) * size})
                    return
                out.append({"key": where or "/", "type": type(value).__name__, "value": value})
                return
            if not node.children:
                empty = {"builtins.list": [], "builtins.tuple": (), "builtins.set": set()}
                out.append({"key": where or "/", "type": _CONTAINERS[node.kind].__name__,
                            "value": empty.get(node.kind, {})})
            labels = node.keys if node.keys is not None else range(len(node.children))
            for k, child in zip(labels, node.children):
                sub = where_of(where, k) if node.keys is not None else f"{where}[{k}]"
                walk(child, [*parts, str(k)], sub)

        walk(self.tree, [], "")
        return out
