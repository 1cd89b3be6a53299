"""Checkpoints: ``cstream.save`` / ``cstream.load`` in HDF5, without pickle.

Layout of a file (``format = "cstream.checkpoint"``, ``version = 1`` on the root group):

* every node of the saved structure is an HDF5 object named by its key; keys are escaped so that
  any string (``"/"``, ``"."``, unicode) or integer key round-trips exactly;
* a tensor is a dataset holding its values (bfloat16 as its uint16 bits, complex as pairs), with
  ``cstream.kind = "tensor"`` and ``cstream.dtype`` attributes;
* a dict / list / tuple is a group with ``cstream.kind`` and, for dicts, the key types;
* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` are typed attributes of a small group.

Loading reads the structure eagerly and tensor values lazily (on first access), and never
executes anything stored in the file: there is nothing to execute, only numbers and strings.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

FORMAT = "cstream.checkpoint"
VERSION = 1
KIND = "cstream.kind"
SUPPORTED = "torch.Tensor, dict, list, tuple, str, bytes, int, float, bool and None"

_DTYPES = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool", torch.complex64: "complex64",
    torch.complex128: "complex128",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _name
_BY_NAME = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A file that is not a readable cstream checkpoint."""


def _escape(key) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(
            f"checkpoint keys must be str or int, got {type(key).__name__}: {key!r}"
        )
    text = str(key)
    out = []
    for ch in text:
        if ch in "/%." or ord(ch) < 32:
            out.append(f"%{ord(ch):02X}")
        else:
            out.append(ch)
    return "".join(out) or "%"


def _unescape(name: str) -> str:
    if name == "%":
        return ""
    out, i = [], 0
    while i < len(name):
        if name[i] == "%":
            out.append(chr(int(name[i + 1:i + 3], 16)))
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def _tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    t = t.detach().to("cpu").contiguous()
    if type(t) is not torch.Tensor:  # a subclass (e.g. a state handle): its plain value
        t = t.clone()
    name = _DTYPES.get(t.dtype)
    if name is None:
        raise TypeError(f"tensors of dtype {t.dtype} cannot be saved")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), name
    return t.numpy(), name


def _write(group, name: str, value, path: str) -> None:

    if isinstance(value, torch.Tensor):
        array, dtype = _tensor_to_numpy(value)
        ds = group.create_dataset(name, data=array)
        ds.attrs[KIND] = "tensor"
        ds.attrs["cstream.dtype"] = dtype
        return
    if isinstance(value, Mapping):
        sub = group.create_group(name, track_order=True)
        sub.attrs[KIND] = "dict"
        keytypes = []
        for k, v in value.items():
            _write(sub, _escape(k), v, f"{path}/{k}")
            keytypes.append("int" if isinstance(k, int) else "str")
        sub.attrs["cstream.keytypes"] = ",".join(keytypes)
        return
    if isinstance(value, (list, tuple)):
        sub = group.create_group(name, track_order=True)
        sub.attrs[KIND] = "tuple" if isinstance(value, tuple) else "list"
        sub.attrs["cstream.length"] = len(value)
        for i, v in enumerate(value):
            _write(sub, str(i), v, f"{path}[{i}]")
        return
    if isinstance(value, (str, bytes, bytearray)):
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        ds = group.create_dataset(name, data=np.frombuffer(data, dtype=np.uint8))
        ds.attrs[KIND] = "str" if isinstance(value, str) else "bytes"
        return
    scalar = group.create_group(name)
    if value is None:
        scalar.attrs[KIND] = "none"
    elif isinstance(value, bool):
        scalar.attrs[KIND] = "bool"
        scalar.attrs["value"] = np.bool_(value)
    elif isinstance(value, int):
        if not -(2 ** 63) <= value < 2 ** 63:
            scalar.attrs[KIND] = "bigint"
            scalar.attrs["value"] = str(value)
        else:
            scalar.attrs[KIND] = "int"
            scalar.attrs["value"] = np.int64(value)
    elif isinstance(value, float):
        scalar.attrs[KIND] = "float"
        scalar.attrs["value"] = np.float64(value)
    else:
        raise TypeError(
            f"cstream.save cannot store {type(value).__name__} at {path or '/'}: checkpoints hold "
            f"{SUPPORTED} (no pickle, so loading never runs code). Convert it first, e.g. to a "
            "tensor, a dict or a string."
        )


def save(obj: Any, path) -> None:
    """Save ``obj`` (nested dicts/lists/tuples of tensors and plain values) to ``path`` (HDF5).

    The write is atomic: the file appears under ``path`` only when complete. Within a run, the
    backend's ``max_checkpoints`` keeps the newest files saved.

    >>> import torch, cstream, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.h5")
    >>> cstream.save({"w": torch.ones(2), "step": 3}, path)
    >>> state = cstream.load(path)
    >>> state["step"], state["w"]
    (3, tensor([1., 1.]))
    """
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w", track_order=True) as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            _write(f, "root", obj, "")
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    from executor import runtime

    backend = runtime.current_backend()
    if backend is not None:
        backend.register_checkpoint(path)


class _LazyTensor:
    """A dataset not read yet."""

    __slots__ = ("file", "name", "map_location")

    def __init__(self, file: "_File", name: str, map_location):
        self.file, self.name, self.map_location = file, name, map_location

    def read(self) -> torch.Tensor:
        return self.file.read_tensor(self.name, self.map_location)


class _File:
    """An open checkpoint file shared by the lazy values of one load."""

    def __init__(self, path: str):
        import h5py

        self.path = path
        try:
            self.h5 = h5py.File(path, "r")
        except FileNotFoundError:
            raise
        except OSError as e:
            raise CheckpointError(
                f"{path} is not a readable cstream checkpoint: it is not an HDF5 file, or it is "
                f"truncated or corrupted ({e})."
            ) from e
        try:
            marked = self.h5.attrs.get("format") == FORMAT and "root" in self.h5
            version = int(self.h5.attrs.get("version", 0))
        except Exception as e:
            self.h5.close()
            raise CheckpointError(
                f"{path} is not a readable cstream checkpoint: its metadata is corrupted ({e})."
            ) from e
        if not marked:
            self.h5.close()
            raise CheckpointError(
                f"{path} is an HDF5 file but not a cstream checkpoint (no format={FORMAT!r} "
                "marker); write checkpoints with cstream.save."
            )
        if version > VERSION:
            self.h5.close()
            raise CheckpointError(
                f"{path} was written by a newer cstream (checkpoint version {version}; this one "
                f"reads up to {VERSION})."
            )

    def read_tensor(self, name: str, map_location) -> torch.Tensor:
        try:
            ds = self.h5[name]
            dtype = str(ds.attrs["cstream.dtype"])
            array = ds[()]
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(
                f"{self.path}: tensor {name[5:] or '/'} cannot be read: the file is corrupted "
                f"({type(e).__name__}: {e})."
            ) from e
        if dtype not in _BY_NAME:
            raise CheckpointError(f"{self.path}: tensor {name[5:]} has an unknown dtype {dtype!r}.")
        array = np.array(array, copy=True)
        if dtype == "bfloat16":
            t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(array)
            if t.dtype != _BY_NAME[dtype]:
                raise CheckpointError(
                    f"{self.path}: tensor {name[5:]} stores {t.dtype} but is marked {dtype}.")
        if map_location is not None and not callable(map_location):
            t = t.to(map_location)
        elif callable(map_location):
            t = map_location(t, "cpu")
        return t


class LazyDict(dict):
    """A dict whose tensor values are read from the file on first access.

    It is a real ``dict`` (``load_state_dict`` accepts it); iteration, ``items()``, ``values()``
    and ``get`` all return loaded tensors.
    """

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if isinstance(value, _LazyTensor):
            value = value.read()
            super().__setitem__(key, value)
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default

    def values(self):
        return [self[k] for k in self.keys()]

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def __iter__(self) -> Iterator:
        return iter(list(self.keys()))

    def copy(self):
        return dict(self.items())

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def _attr(node, name, path):
    try:
        return node.attrs[name]
    except Exception as e:
        raise CheckpointError(
            f"{path}: entry {node.name[5:] or '/'} is missing its {name!r} attribute; the file is "
            "corrupted or was not written by cstream.save."
        ) from e


def _read(file: _File, node, map_location):
    import h5py

    kind = str(_attr(node, KIND, file.path))
    if kind == "tensor":
        if not isinstance(node, h5py.Dataset):
            raise CheckpointError(f"{file.path}: {node.name} is marked a tensor but is a group.")
        return _LazyTensor(file, node.name, map_location)
    if kind == "dict":
        keytypes = str(node.attrs.get("cstream.keytypes", ""))
        types = keytypes.split(",") if keytypes else []
        out = LazyDict()
        names = list(node.keys())
        if len(types) != len(names):
            raise CheckpointError(f"{file.path}: dict {node.name[5:] or '/'} is inconsistent.")
        for name, ktype in zip(names, types):
            key = _unescape(name)
            out[int(key) if ktype == "int" else key] = _read(file, node[name], map_location)
        return out
    if kind in ("list", "tuple"):
        n = int(_attr(node, "cstream.length", file.path))
        items = []
        for i in range(n):
            if str(i) not in node:
                raise CheckpointError(f"{file.path}: {kind} {node.name[5:]} lacks item {i}.")
            items.append(_read(file, node[str(i)], map_location))
        items = [_materialize_lazy(v) for v in items]
        return tuple(items) if kind == "tuple" else items
    if kind == "none":
        return None
    if kind in ("str", "bytes"):
        try:
            raw = bytes(np.asarray(node[()], dtype=np.uint8).tobytes())
            return raw.decode("utf-8") if kind == "str" else raw
        except Exception as e:
            raise CheckpointError(
                f"{file.path}: {kind} entry {node.name[5:] or '/'} cannot be read ({e}).") from e
    value = _attr(node, "value", file.path)
    if kind == "bool":
        return bool(value)
    if kind == "int":
        return int(value)
    if kind == "bigint":
        return int(str(value))
    if kind == "float":
        return float(value)
    raise CheckpointError(
        f"{file.path}: entry {node.name[5:] or '/'} has kind {kind!r}, which cstream.load does "
        f"not know; cstream checkpoints hold {SUPPORTED}."
    )


def _materialize_lazy(v):
    return v.read() if isinstance(v, _LazyTensor) else v


def load(path, map_location=None):
    """Load what :func:`save` wrote. Tensor values are read when first accessed.

    ``map_location`` is a device (``"cpu"``, ``torch.device``) or a callable
    ``(tensor, "cpu") -> tensor``, as in ``torch.load``. ``load(path, map_location="cpu")``
    followed by ``torch.save`` converts a checkpoint to PyTorch's pickle format.
    """
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    file = _File(path)
    try:
        root = _read(file, file.h5["root"], map_location)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"{path} is not a readable cstream checkpoint: its structure is corrupted "
            f"({type(e).__name__}: {e})."
        ) from e
    return _materialize_lazy(root)


def to_eager(obj):
    """Read every lazy value (a plain nested structure of tensors)."""
    if isinstance(obj, LazyDict):
        return {k: to_eager(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_eager(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_eager(v) for v in obj)
    return obj
