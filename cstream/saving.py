"""Checkpoints: ``cstream.save`` / ``cstream.load`` in HDF5, without pickle.

A checkpoint is an ordinary HDF5 file (h5py, ``h5dump`` and other tools read it):

* the root group carries ``format = "cstream.checkpoint"`` and ``version = 2``; the saved object is
  the node ``/root``;
* a tensor is a dataset holding its values, with attributes ``cstream.kind = "tensor"``,
  ``cstream.dtype`` (the torch dtype's name) and ``cstream.crc32``. Dtypes numpy lacks (bfloat16,
  float8, complex32) are stored as unsigned integers of the same width, bit for bit;
* a dict / list / tuple is a group (``cstream.kind``; items of lists and tuples are named ``0``,
  ``1``, ...). A str key is escaped into a member name (``%``, ``/``, ``.``, control characters and
  lone surrogates become ``%XX`` / ``%uXXXX``; ``""`` is ``%``) and an int key ``k`` is named ``%ik``;
* ``str`` and ``bytes`` are ``uint8`` datasets (UTF-8, ``surrogatepass``); ``None``, ``bool``,
  ``int`` and ``float`` are small groups with a typed ``value`` attribute (big ints as text).

Beside the HDF5 structure, the file holds an index that ``cstream.load`` reads instead of walking
HDF5 metadata: a 512-byte HDF5 user block starting with :data:`MAGIC`, and at the end of the file
(after HDF5's own end of data) the index as JSON, then a 32-byte footer (``<8sQQI4s``: ``b"CSTRMIDX"``,
index offset, index length, CRC-32 of the index, ``b"END\\n"``). The index lists every node with its
type and, for tensors, dtype, shape, byte offset, size and CRC-32 of the values in the file. So a
load costs one small read, tensors are read with one ``pread`` each when first accessed and checked
against their CRC-32, and a damaged file raises :class:`CheckpointError` instead of loading wrong
numbers or hanging in a corrupted HDF5 structure. Nothing is executed: the file holds only numbers
and strings.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import secrets
import struct
import zlib
from collections.abc import ItemsView, Mapping, ValuesView
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = "cstream.checkpoint"
VERSION = 2
MAGIC = b"\x89CSTREAM-CHECKPOINT\r\n\x1a\n"
USERBLOCK = 512
_FOOTER = struct.Struct("<8sQQI4s")
_FOOTER_START, _FOOTER_END = b"CSTRMIDX", b"END\n"
KIND = "cstream.kind"
SUPPORTED = "torch.Tensor, dict (str or int keys), list, tuple, str, bytes, int, float, bool and None"

_NUMPY_DTYPES = [
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "complex128",
]
# dtypes numpy lacks: stored as the unsigned integers of the same width
_BITS_DTYPES = {
    "bfloat16": "uint16", "complex32": "uint32", "float8_e4m3fn": "uint8", "float8_e4m3fnuz": "uint8",
    "float8_e5m2": "uint8", "float8_e5m2fnuz": "uint8", "float8_e8m0fnu": "uint8",
    "float4_e2m1fn_x2": "uint8",
}
_BY_NAME = {n: getattr(torch, n) for n in [*_NUMPY_DTYPES, *_BITS_DTYPES] if hasattr(torch, n)}
_NAME_OF = {d: n for n, d in _BY_NAME.items()}
_SIGNED = {"uint8": torch.uint8, "uint16": torch.int16, "uint32": torch.int32}


class CheckpointError(ValueError):
    """A file that is not a readable cstream checkpoint (not HDF5, foreign, truncated, corrupted)."""


# -- key names ----------------------------------------------------------------------------------
def _name_of_key(key, path: str) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"%i{int(key)}"
    if not isinstance(key, str):
        raise TypeError(
            f"cstream.save cannot store the key {key!r} ({type(key).__name__}) in the dict at "
            f"{path or '/'}: dict keys must be str or int. Convert the key, e.g. with str()."
        )
    out = []
    for ch in key:
        code = ord(ch)
        if ch in "/%." or code < 32:
            out.append(f"%{code:02X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"%u{code:04X}")
        else:
            out.append(ch)
    return "".join(out) or "%"


def _child_path(path: str, key) -> str:
    """``model/weight``, ``state[0]``: how errors and ``cstream ckpt inspect`` name an entry."""
    if isinstance(key, str):
        return f"{path}/{key}" if path else key
    return f"{path}[{key}]"


# -- writing ------------------------------------------------------------------------------------
def _tensor_to_numpy(t: torch.Tensor, path: str) -> tuple[np.ndarray, str]:
    where = path or "/"
    if t.layout != torch.strided:
        raise TypeError(
            f"cstream.save cannot store the {t.layout} tensor at {where}: only dense tensors are "
            "stored. Convert it first with .to_dense()."
        )
    name = _NAME_OF.get(t.dtype)
    if name is None:
        raise TypeError(
            f"cstream.save cannot store the {t.dtype} tensor at {where}: supported dtypes are "
            f"{', '.join(sorted(_BY_NAME))}. Convert it first, e.g. with .dequantize() or .float()."
        )
    if t.device.type == "meta":
        raise TypeError(
            f"cstream.save cannot store the tensor at {where}: it is on the meta device and has no "
            "values. Materialise it (e.g. load or initialise the model's weights) before saving."
        )
    t = t.detach().to("cpu").contiguous()
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    if name in _BITS_DTYPES:
        stored = _BITS_DTYPES[name]
        return t.view(_SIGNED[stored]).numpy().view(stored), name
    return t.numpy(), name


class _Writer:
    """Writes one nested object as HDF5 nodes and returns its index entry (plain JSON data).

    CRC-32s of tensor values run on a helper thread beside the HDF5 writes (zlib releases the GIL).
    """

    def __init__(self, pool: ThreadPoolExecutor):
        self.pool = pool

    def write(self, group, name: str, value, path: str) -> dict:
        if isinstance(value, torch.Tensor):
            array, dtype = _tensor_to_numpy(value, path)
            crc = self.pool.submit(zlib.crc32, array)
            ds = group.create_dataset(name, data=array)
            ds.attrs[KIND] = "tensor"
            ds.attrs["cstream.dtype"] = dtype
            offset = ds.id.get_offset() if array.nbytes else 0
            if offset is None:
                raise RuntimeError(f"HDF5 allocated no storage for the tensor at {path or '/'}")
            entry = {"k": "tensor", "dtype": dtype, "shape": list(array.shape),
                     "nbytes": array.nbytes, "offset": int(offset), "crc": crc.result()}
            ds.attrs["cstream.crc32"] = np.uint32(entry["crc"])
            return entry
        if isinstance(value, Mapping):
            sub = group.create_group(name, track_order=True)
            sub.attrs[KIND] = "dict"
            items = []
            for k in value:
                child = _name_of_key(k, path)
                items.append([int(k) if isinstance(k, int) else k,
                              self.write(sub, child, value[k], _child_path(path, k))])
            return {"k": "dict", "items": items}
        if isinstance(value, (list, tuple)):
            kind = "tuple" if isinstance(value, tuple) else "list"
            sub = group.create_group(name, track_order=True)
            sub.attrs[KIND] = kind
            sub.attrs["cstream.length"] = np.int64(len(value))
            return {"k": kind, "items": [self.write(sub, str(i), v, f"{path}[{i}]")
                                         for i, v in enumerate(value)]}
        if isinstance(value, (str, bytes, bytearray)):
            data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
            ds = group.create_dataset(name, data=np.frombuffer(data, dtype=np.uint8))
            if isinstance(value, str):
                ds.attrs[KIND] = "str"
                return {"k": "str", "v": str(value)}
            ds.attrs[KIND] = "bytes"
            return {"k": "bytes", "v": base64.b64encode(data).decode("ascii")}
        if value is None or isinstance(value, (bool, int, float)):
            scalar = group.create_group(name)
            if value is None:
                scalar.attrs[KIND] = "none"
                return {"k": "none"}
            if isinstance(value, bool):
                scalar.attrs[KIND] = "bool"
                scalar.attrs["value"] = np.bool_(value)
                return {"k": "bool", "v": bool(value)}
            if isinstance(value, int):
                small = -(2 ** 63) <= value < 2 ** 63
                scalar.attrs[KIND] = "int" if small else "bigint"
                scalar.attrs["value"] = np.int64(value) if small else str(int(value))
                return {"k": "int", "v": int(value)}
            scalar.attrs[KIND] = "float"
            scalar.attrs["value"] = np.float64(value)
            return {"k": "float", "bits": struct.unpack("<q", struct.pack("<d", value))[0]}
        raise TypeError(
            f"cstream.save cannot store {type(value).__name__} at {path or '/'}: checkpoints hold "
            f"{SUPPORTED} (no pickle, so loading never runs code). Convert it first, e.g. to a "
            "tensor, a dict or a string."
        )


def _check_path_argument(path, fn: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{fn} takes a file path (str or os.PathLike), got {type(path).__name__}: {path!r}. "
            "File objects are not supported: pass the path of the checkpoint file."
        )
    return os.fspath(path)


def _write_file(obj, tmp: Path) -> None:
    import h5py

    with ThreadPoolExecutor(max_workers=1) as pool, h5py.File(
            tmp, "w", userblock_size=USERBLOCK, libver=("v108", "latest"), track_order=True) as f:
        f.attrs["format"] = FORMAT
        f.attrs["version"] = np.int64(VERSION)
        root = _Writer(pool).write(f, "root", obj, "")
    index = json.dumps({"format": FORMAT, "version": VERSION, "root": root},
                       separators=(",", ":")).encode("ascii")
    with open(tmp, "r+b") as fh:
        fh.write(MAGIC + struct.pack("<I", VERSION))
        start = fh.seek(0, os.SEEK_END)
        fh.write(index)
        fh.write(_FOOTER.pack(_FOOTER_START, start, len(index), zlib.crc32(index), _FOOTER_END))
        fh.flush()
        os.fsync(fh.fileno())


def save(obj: Any, path) -> None:
    """Save ``obj`` (nested dicts/lists/tuples of tensors and plain values) to ``path`` (HDF5).

    Used exactly like ``torch.save``. The write is atomic: the file appears under ``path`` only when
    complete, so a crash leaves any earlier file there intact. Within a run, the backend's
    ``max_checkpoints`` keeps only the newest files saved. Subclasses of the supported types are
    stored as the base type (an ``OrderedDict`` loads as a dict, a namedtuple as a tuple).

    >>> import torch, cstream, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.h5")
    >>> cstream.save({"w": torch.ones(2), "step": 3, "betas": (0.9, 0.99)}, path)
    >>> state = cstream.load(path)
    >>> state["step"], state["betas"], state["w"]
    (3, (0.9, 0.99), tensor([1., 1.]))
    """
    path = Path(_check_path_argument(path, "cstream.save"))
    if path.is_dir():
        raise IsADirectoryError(f"cstream.save: {path} is a directory; pass a file path like "
                                f"{path / 'checkpoint.h5'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies
    try:
        _write_file(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    from executor import runtime

    backend = runtime.current_backend()
    if backend is not None:
        backend.register_checkpoint(path)


# -- reading ------------------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


class _File:
    """An open checkpoint: its index, and the descriptor lazy tensors read from."""

    def __init__(self, path: str):
        self.path = path
        if os.path.isdir(path):
            raise CheckpointError(f"{path} is a directory, not a checkpoint file.")
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self.index, self.data_end = self._read_index()
        except BaseException:
            os.close(self.fd)
            self.fd = None
            raise

    def __del__(self):
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)
            self.fd = None

    def error(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path} is not a readable cstream checkpoint: {what}.")

    def pread(self, n: int, offset: int) -> bytes:
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise self.error(f"it ends before byte {offset + n} (truncated)")
        return data

    def _read_index(self):
        size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, len(MAGIC) + 4, 0)
        if not head.startswith(MAGIC):
            if head.startswith(b"\x89HDF\r\n\x1a\n"):
                raise self.error(f"it is an HDF5 file but not a cstream checkpoint (no {FORMAT!r} "
                                 "header); write checkpoints with cstream.save")
            raise self.error("it is not a cstream checkpoint (an HDF5 file written by "
                             "cstream.save); it does not start with the checkpoint header")
        if len(head) < len(MAGIC) + 4:
            raise self.error(f"it is only {size} bytes long (truncated)")
        (version,) = struct.unpack("<I", head[len(MAGIC):])
        if not 2 <= version <= VERSION:
            raise self.error(f"its format version is {version}; this cstream reads version "
                             f"{VERSION}. Load it with the cstream that wrote it")
        if size < USERBLOCK + _FOOTER.size:
            raise self.error(f"it is only {size} bytes long (truncated)")
        start, offset, length, crc, end = _FOOTER.unpack(self.pread(_FOOTER.size, size - _FOOTER.size))
        if start != _FOOTER_START or end != _FOOTER_END or offset + length + _FOOTER.size != size \
                or offset < USERBLOCK:
            raise self.error("its index footer is missing or damaged (the file is truncated, was "
                             "modified by another program, or is corrupted)")
        raw = self.pread(length, offset)
        if zlib.crc32(raw) != crc:
            raise self.error("its index does not match its checksum (the file is corrupted)")
        try:
            index = json.loads(raw.decode("ascii"))
        except (ValueError, RecursionError) as e:
            raise self.error(f"its index cannot be parsed ({_one_line(e)})") from e
        if not isinstance(index, dict) or index.get("format") != FORMAT or "root" not in index:
            raise self.error("its index does not describe a checkpoint")
        return index, offset

    def read_tensor(self, entry: dict, where: str, device) -> torch.Tensor:
        dtype, shape, nbytes, offset = entry["dtype"], entry["shape"], entry["nbytes"], entry["offset"]
        stored = np.dtype(_BITS_DTYPES.get(dtype, dtype))
        array = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            got = os.preadv(self.fd, [array], offset)
            while got < nbytes:
                more = os.preadv(self.fd, [memoryview(array)[got:]], offset + got)
                if more == 0:
                    raise self.error(f"the tensor {where} ends past the end of the file (truncated)")
                got += more
        if zlib.crc32(array) != entry["crc"]:
            raise CheckpointError(f"{self.path}: the tensor {where} is corrupted: its data does not "
                                  "match its checksum.")
        array = array.view(stored).reshape(shape)
        if dtype in _BITS_DTYPES:
            signed = _SIGNED[stored.name]
            t = torch.from_numpy(array).view(signed) if signed != torch.uint8 else torch.from_numpy(array)
            t = t.view(_BY_NAME[dtype])
        else:
            t = torch.from_numpy(array)
        return device(t) if device is not None else t


class _LazyTensor:
    """A tensor not read yet (never handed out: containers replace it on access)."""

    __slots__ = ("file", "entry", "where", "device")

    def __init__(self, file: _File, entry: dict, where: str, device):
        self.file, self.entry, self.where, self.device = file, entry, where, device

    def read(self) -> torch.Tensor:
        return self.file.read_tensor(self.entry, self.where, self.device)


def _real(value):
    return value.read() if isinstance(value, _LazyTensor) else value


class LazyDict(dict):
    """A dict whose tensor values are read from the checkpoint file on first access.

    It is a real ``dict`` and hands out only real tensors (``[]``, ``get``, ``items()``,
    ``values()``, ``pop``, ``dict(d)``, ``{**d}``, ``copy()``), so ``model.load_state_dict`` and
    ``optimizer.load_state_dict`` take it directly. Pickling it (``torch.save``) reads every value
    and stores a ``collections.OrderedDict``, which ``torch.load(weights_only=True)`` accepts.
    """

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if isinstance(value, _LazyTensor):
            value = value.read()
            super().__setitem__(key, value)
        return value

    def __iter__(self):  # a Python-level __iter__ makes dict(d) and {**d} go through __getitem__
        return super().__iter__()

    def get(self, key, default=None):
        return self[key] if key in self else default

    def values(self):
        return ValuesView(self)

    def items(self):
        return ItemsView(self)

    def pop(self, key, *default):
        return _real(super().pop(key, *default))

    def popitem(self):
        key, value = super().popitem()
        return key, _real(value)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self):
        return dict(self.items())

    def __or__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**self, **other}

    def __ror__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self}

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __reduce_ex__(self, protocol):
        return (collections.OrderedDict, (), None, None, iter(self.items()))

    def __repr__(self) -> str:
        return repr(dict(self.items()))



def _check_tensor_entry(file: _File, e: dict, where: str) -> None:
    dtype, shape = e.get("dtype"), e.get("shape")
    if dtype not in _BY_NAME:
        raise file.error(f"the tensor {where} has the unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise file.error(f"the tensor {where} has a malformed shape {shape!r}")
    nbytes, offset, crc = e.get("nbytes"), e.get("offset"), e.get("crc")
    itemsize = np.dtype(_BITS_DTYPES.get(dtype, dtype)).itemsize
    if type(nbytes) is not int or nbytes != int(np.prod(shape, dtype=object)) * itemsize:
        raise file.error(f"the tensor {where} has a size {nbytes!r} that does not match its shape")
    if type(offset) is not int or type(crc) is not int or (
            nbytes and not USERBLOCK <= offset <= file.data_end - nbytes):
        raise file.error(f"the tensor {where} points outside the file's data")


def _build(file: _File, e, where: str, device):
    """The loaded value of one index entry (tensors of dicts stay lazy)."""
    if not isinstance(e, dict):
        raise file.error(f"the entry {where} is malformed")
    kind = e.get("k")
    if kind == "tensor":
        _check_tensor_entry(file, e, where)
        return _LazyTensor(file, e, where, device)
    if kind == "dict":
        out = LazyDict()
        for pair in _items(file, e, where):
            if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) in (int, str)):
                raise file.error(f"the dict {where} has a malformed item")
            key = pair[0]
            out[key] = _build(file, pair[1], _child_path(where if where != "/" else "", key), device)
        return out
    if kind in ("list", "tuple"):
        base = where if where != "/" else ""
        items = [_real(_build(file, v, f"{base}[{i}]", device))
                 for i, v in enumerate(_items(file, e, where))]
        return tuple(items) if kind == "tuple" else items
    value = e.get("v")
    if kind == "none":
        return None
    if kind == "str" and type(value) is str:
        return value
    if kind == "bytes" and type(value) is str:
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except ValueError as err:
            raise file.error(f"the bytes {where} are malformed") from err
    if kind == "bool" and type(value) is bool:
        return value
    if kind == "int" and type(value) is int:
        return value
    if kind == "float" and type(e.get("bits")) is int and -(2 ** 63) <= e["bits"] < 2 ** 63:
        return struct.unpack("<d", struct.pack("<q", e["bits"]))[0]
    raise file.error(f"the entry {where} has the kind {kind!r} with a malformed value; cstream "
                     f"checkpoints hold {SUPPORTED}")


def _items(file: _File, e: dict, where: str) -> list:
    items = e.get("items")
    if not isinstance(items, list):
        raise file.error(f"the {e.get('k')} {where} has no item list")
    return items


def _device_function(map_location):
    """``map_location`` (as ``torch.load`` takes it) as a function applied to each tensor read."""
    if map_location is None:
        return None
    if isinstance(map_location, dict):  # {saved location: new location}; tensors are saved from "cpu"
        return _device_function(map_location.get("cpu"))
    if callable(map_location) and not isinstance(map_location, (str, torch.device)):
        def call(t):
            moved = map_location(t, "cpu")
            return t if moved is None else moved
        return call
    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(
            f"cstream.load: map_location must be None, a device (\"cpu\", torch.device), a dict or "
            f"a callable, got {type(map_location).__name__}: {map_location!r}"
        )
    try:
        device = torch.device(map_location)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise ValueError(
            f"cstream.load: map_location={map_location!r} is not a usable device here "
            f"({_one_line(e)}); use map_location=\"cpu\"."
        ) from e
    if device.type == "cpu":
        return None  # values are read into CPU memory already
    return lambda t: t.to(device)


def _open(path, fn: str) -> _File:
    path = _check_path_argument(path, fn)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    return _File(path)


def load(path, map_location=None):
    """Load what :func:`save` wrote. Tensor values of dicts are read when first accessed.

    Used exactly like ``torch.load``: ``model.load_state_dict(cstream.load(path)["model"])``.
    ``map_location`` is what ``torch.load`` takes: ``None``, a device (``"cpu"``,
    ``torch.device``), a dict of locations, or a callable ``(tensor, "cpu") -> tensor``. Dicts come
    back as :class:`LazyDict` (a ``dict``); tensors inside lists and tuples are read at load.
    ``torch.save(cstream.load(path, map_location="cpu"), "ckpt.pt")`` converts a checkpoint to
    PyTorch's pickle format. A file that is not a readable checkpoint raises
    :class:`CheckpointError` (a ``ValueError``) naming it; a tensor whose bytes were damaged raises
    it when read.

    >>> import torch, cstream, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.h5")
    >>> model = torch.nn.Linear(2, 1)
    >>> cstream.save({"model": model.state_dict()}, path)
    >>> torch.nn.Linear(2, 1).load_state_dict(cstream.load(path)["model"])
    <All keys matched successfully>
    """
    device = _device_function(map_location)
    file = _open(path, "cstream.load")
    try:
        return _real(_build(file, file.index["root"], "/", device))
    except RecursionError as e:
        raise file.error("its structure is nested too deeply") from e


def to_eager(obj):
    """Read every lazy value: plain dicts, lists and tuples of tensors (what ``torch.load`` gives)."""
    if isinstance(obj, dict):
        return {k: to_eager(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_eager(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_eager(v) for v in obj)
    return obj


def describe(path) -> list[dict]:
    """Every entry of a checkpoint, from its index only (no tensor values are read).

    Each entry is a dict: ``key`` (a path like ``model/weight`` or ``state[0]``), ``type``
    (``"tensor"``, ``"int"``, ``"str"``...), and for tensors ``dtype``, ``shape`` and ``nbytes``;
    for other values ``value``. Empty dicts, lists and tuples are entries of their own.

    >>> import torch, cstream, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.h5")
    >>> cstream.save({"w": torch.ones(2, 3), "step": 3}, path)
    >>> [(e["key"], e["type"], e.get("shape", e.get("value"))) for e in describe(path)]
    [('w', 'tensor', (2, 3)), ('step', 'int', 3)]
    """
    file = _open(path, "describe")
    out: list[dict] = []

    def walk(e, key: str):
        kind = e.get("k") if isinstance(e, dict) else None
        if kind == "tensor":
            _check_tensor_entry(file, e, key or "/")
            out.append({"key": key or "/", "type": "tensor", "dtype": e["dtype"],
                        "shape": tuple(e["shape"]), "nbytes": e["nbytes"]})
        elif kind in ("dict", "list", "tuple"):
            items = _items(file, e, key or "/")
            if not items:
                out.append({"key": key or "/", "type": kind,
                            "value": {"dict": {}, "list": []}.get(kind, ())})
            for i, item in enumerate(items):
                if kind != "dict":
                    walk(item, f"{key}[{i}]")
                elif isinstance(item, list) and len(item) == 2 and type(item[0]) in (int, str):
                    walk(item[1], _child_path(key, item[0]))
                else:
                    raise file.error(f"the dict {key or '/'} has a malformed item")
        else:
            value = _build(file, e, key or "/", None)
            out.append({"key": key or "/", "type": type(value).__name__, "value": value})

    try:
        walk(file.index["root"], "")
    except RecursionError as e:
        raise file.error("its structure is nested too deeply") from e
    return out
