"""Checkpoints: ``cstream.save`` / ``cstream.load``, in the file layout of ``cerebras.pytorch``.

:func:`save` writes the real package's HDF5 layout (described in :mod:`cstream.checkpoint.h5`), so a
file saved by cstream loads with ``cerebras.pytorch.load`` and the other way round. :func:`load`
reads that layout, the real package's earlier ones and cstream's own earlier one
(:mod:`cstream.checkpoint.v2`): :func:`cstream.checkpoint.opener.open_checkpoint` tells them apart
and gives the reader. Loading never runs code from the file: the few pickled values the real layout
holds are read by an unpickler that admits only plain types (:mod:`cstream.checkpoint.safe_pickle`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import torch

from cstream.checkpoint import guard, h5
from cstream.checkpoint.lazy import CheckpointError, LazyDict
from cstream.checkpoint.opener import looks_like_checkpoint, open_checkpoint, path_argument

__all__ = ["CheckpointError", "LazyDict", "describe", "describe_and_layout", "layout", "load",
           "looks_like_checkpoint", "save", "to_eager"]

def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cstream")
    except PackageNotFoundError:
        return "unknown"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def save(obj: Any, path, *, compress: bool = True) -> None:
    """Save ``obj`` (nested dicts/lists/tuples of tensors and plain values) to ``path`` (HDF5).

    Used exactly like ``torch.save``. The file is in ``cerebras.pytorch``'s layout: its ``load``
    reads it with the same keys, dtypes (bfloat16 and float16 included) and values. Tensors are
    LZ4-compressed as the real package writes them (files of its size: zeros, as in a young
    optimizer state, take almost no room); ``compress=False`` stores them uncompressed and
    contiguous, which loads without decoding (each tensor a view of the file mapped into memory)
    at the cost of the file's full size. The write is
    atomic: the file appears under ``path`` only when complete, so a crash leaves any earlier file
    there intact. Within a run, the backend's ``max_checkpoints`` keeps only the newest files
    saved. Subclasses of the supported types are stored as the base type (a namedtuple loads as a
    tuple); every dict, ``OrderedDict`` included, loads as a dict. Two values whose dotted key
    paths are the same (``{"a.b": x, "a": {"b": y}}``, ``{1: x, "1": y}``) are refused: the
    layout names every value by that path.

    >>> import torch, cstream, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.h5")
    >>> cstream.save({"w": torch.ones(2), "step": 3, "betas": (0.9, 0.99)}, path)
    >>> state = cstream.load(path)
    >>> state["step"], state["betas"], state["w"]
    (3, (0.9, 0.99), tensor([1., 1.]))
    """
    path = Path(path_argument(path, "cstream.save"))
    if path.is_dir():
        raise IsADirectoryError(f"cstream.save: {path} is a directory; pass a file path like "
                                f"{path / 'checkpoint.h5'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies
    try:
        h5.write(obj, tmp, writer=f"cstream {_version()}",
                 userblock_size=guard.USERBLOCK, compress=compress)
        guard.seal(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync(path.parent)
    from executor import runtime

    backend = runtime.current_backend()
    if backend is not None:
        backend.register_checkpoint(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _device_function(map_location):
    """``map_location`` (as ``torch.load`` takes it, or ``cerebras.pytorch.load``'s
    ``"cache"``) as a function applied to each tensor read."""
    if map_location is None or (isinstance(map_location, str) and map_location == "cache"):
        return None  # tensors are read into CPU memory once, when first touched
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


def load(path, map_location=None):
    """Load what :func:`save` wrote. Tensor values of dicts are read when first accessed.

    Used exactly like ``torch.load``: ``model.load_state_dict(cstream.load(path)["model"])``.
    ``map_location`` is what ``torch.load`` takes: ``None``, a device (``"cpu"``, ``"cuda"``,
    ``torch.device``), a dict of locations (the file's tensors count as saved from ``"cpu"``), or a
    callable ``(tensor, "cpu") -> tensor``; ``"cache"`` (``cerebras.pytorch``'s: read each tensor
    once, when first touched) is what cstream does for ``None`` too. Tensors saved from a GPU load
    into CPU memory unless ``map_location`` says otherwise. Dicts come
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
    return open_checkpoint(path, "cstream.load").load(device)


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
    return open_checkpoint(path, "describe").describe()


def describe_and_layout(path) -> tuple[list[dict], str]:
    """:func:`describe` and :func:`layout` of one checkpoint, from one opening of the file."""
    checkpoint = open_checkpoint(path, "describe")
    return checkpoint.describe(), checkpoint.layout


def layout(path) -> str:
    """Which layout the checkpoint at ``path`` is in, and who wrote it, in words.

    >>> import torch, cstream, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.h5")
    >>> cstream.save({"w": torch.ones(2)}, path)
    >>> layout(path).startswith("cerebras.pytorch layout 0.5, written by cstream ")
    True
    """
    return open_checkpoint(path, "layout").layout
