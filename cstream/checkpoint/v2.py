"""Reading checkpoints in cstream's own earlier layout (format "cstream.checkpoint", version 2).

cstream 0.1 wrote this layout; :func:`cstream.save` now writes the ``cerebras.pytorch`` layout
(:mod:`cstream.checkpoint.h5`) and this module keeps files of the earlier layout loading. It is an
HDF5 file whose nodes mirror the saved object, with a 512-byte user block starting with
:data:`MAGIC` and, after HDF5's end of data, an index (JSON) and a 32-byte footer (``<8sQQI4s``:
``b"CSTRMIDX"``, index offset, index length, CRC-32 of the index, ``b"END\\n"``). The index lists
every node with its type and, for tensors, dtype, shape, byte offset, size and CRC-32 of the values,
so a load reads the index only and each tensor with one ``pread`` when first touched, checked
against its CRC-32. Dtypes numpy lacks (bfloat16, float8, complex32) are stored as unsigned integers
of the same width, bit for bit. Nothing is executed: the file holds only numbers and strings.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib

import numpy as np
import torch

from cstream.checkpoint.host_memory import host_array
from cstream.checkpoint.lazy import CheckpointError, Lazy, LazyDict, real

FORMAT = "cstream.checkpoint"
VERSION = 2
MAGIC = b"\x89CSTREAM-CHECKPOINT\r\n\x1a\n"
USERBLOCK = 512
_FOOTER = struct.Struct("<8sQQI4s")
_FOOTER_START, _FOOTER_END = b"CSTRMIDX", b"END\n"
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
_SIGNED = {"uint8": torch.uint8, "uint16": torch.int16, "uint32": torch.int32}



def _child_path(path: str, key) -> str:
    """``model/weight``, ``state[0]``: how errors and ``cstream ckpt inspect`` name an entry."""
    if isinstance(key, str):
        return f"{path}/{key}" if path else key
    return f"{path}[{key}]"


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
        array = host_array((nbytes,), np.uint8)
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
        return Lazy(lambda: file.read_tensor(e, where, device))
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
        items = [real(_build(file, v, f"{base}[{i}]", device))
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


class V2Checkpoint:
    """An open version-2 checkpoint (:func:`cstream.checkpoint.opener.open_checkpoint` makes it)."""

    layout = f"cstream's earlier layout (version {VERSION}), written by cstream 0.1"

    def __init__(self, path: str):
        self.file = _File(path)

    def load(self, device):
        """The object the file holds; tensors of dicts are read when first touched."""
        try:
            return real(_build(self.file, self.file.index["root"], "/", device))
        except RecursionError as e:
            raise self.file.error("its structure is nested too deeply") from e

    def describe(self) -> list[dict]:
        """Every entry of the file, from its index only (see
        :func:`cstream.checkpoint.saving.describe`)."""
        file = self.file
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
