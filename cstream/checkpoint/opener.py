"""The one opener of a checkpoint file: it tells the layout from the file's first bytes and, for an
HDF5 file, from its ``__version__`` attribute, read once, and gives the reader of that layout:

* :class:`cstream.checkpoint.v2.V2Checkpoint` for cstream's earlier layout (its header);
* :class:`cstream.checkpoint.h5.H5Checkpoint` for ``cerebras.pytorch``'s layout 0.5;
* :class:`cstream.checkpoint.h5_legacy.LegacyH5Checkpoint` for its layouts 0.1 to 0.4.

Each reader has ``load(device)``, ``describe()`` and ``layout``. Before HDF5 reads any of a file,
:func:`cstream.checkpoint.guard.check` checks it (its seal, or an unsealed file's structure).
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from cstream.checkpoint import guard, v2
from cstream.checkpoint.h5 import _H5_ERRORS, VERSION, H5Checkpoint, one, unreadable
from cstream.checkpoint.h5_legacy import LegacyH5Checkpoint
from cstream.checkpoint.lazy import CheckpointError

Checkpoint = H5Checkpoint | v2.V2Checkpoint  # LegacyH5Checkpoint is an H5Checkpoint


def path_argument(path, fn: str) -> str:
    """``path`` as a string, or a TypeError saying what ``fn`` takes."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{fn} takes a file path (str or os.PathLike), got {type(path).__name__}: {path!r}. "
            "File objects are not supported: pass the path of the checkpoint file."
        )
    return os.fspath(path)


def _heads(path) -> tuple[bytes, bytes]:
    """The file's first bytes and those after a user block: what tells its format."""
    with open(path, "rb") as fh:
        head = fh.read(len(guard.TAG))
        fh.seek(guard.USERBLOCK)
        return head, fh.read(len(guard.HDF5_SIGNATURE))


def looks_like_checkpoint(path) -> bool:
    """Whether the file at ``path`` starts as a checkpoint :func:`open_checkpoint` reads (cstream's
    seal, HDF5 at its start or after a user block, cstream's earlier layout), damaged or not,
    whatever its name."""
    head, after_userblock = _heads(path)
    return (head.startswith((v2.MAGIC, guard.HDF5_SIGNATURE))
            or after_userblock == guard.HDF5_SIGNATURE
            or bool(head) and guard.TAG.startswith(head))  # sealed, or cut inside the tag


def open_checkpoint(path, fn: str) -> Checkpoint:
    """The reader of the checkpoint at ``path``; ``fn`` (the function called) names a bad
    argument's error."""
    path = path_argument(path, fn)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a directory, not a checkpoint file.")
    head, after_userblock = _heads(path)
    if head.startswith(v2.MAGIC):
        return v2.V2Checkpoint(path)
    if not head:
        raise guard.damaged(path, "it is empty (0 bytes): its writer stopped before it wrote anything")
    if len(head) < len(guard.TAG) and guard.TAG.startswith(head):
        raise guard.damaged(path, f"it is truncated: it has {len(head)} bytes, fewer than its header")
    if not (guard.is_sealed(head) or head.startswith(guard.HDF5_SIGNATURE)
            or after_userblock == guard.HDF5_SIGNATURE):
        raise CheckpointError(
            f"{path} is not a readable checkpoint: it is not an HDF5 file (it does not start with "
            "the HDF5 signature); cstream.load reads files written by cstream.save or "
            "cerebras.pytorch.save.")
    guard.check(path, head)  # before HDF5 reads any of it
    try:
        file = h5py.File(path, "r")
    except OSError as e:
        raise unreadable(path, f"HDF5 cannot open it ({' '.join(str(e).split())})") from e
    try:
        attrs = _root_attributes(path, file)
        version = _layout_version(path, attrs)
        reader = H5Checkpoint if version == VERSION else LegacyH5Checkpoint
        return reader(path, file, attrs, version)
    except BaseException:
        file.close()
        raise


def _root_attributes(path: str, file: h5py.File) -> dict:
    try:
        return dict(file.attrs)
    except _H5_ERRORS as e:
        raise unreadable(path, f"its attributes cannot be read ({' '.join(str(e).split())})") from e


def _layout_version(path: str, attrs: dict) -> float:
    """The file's ``__version__``: 0.5, or one of the layouts before it (a float below 0.5)."""
    if "__version__" not in attrs:
        raise unreadable(path, "it is an HDF5 file but not a checkpoint (it has no __version__ "
                               "attribute); write checkpoints with cstream.save or cerebras.pytorch.save")
    version = one(attrs["__version__"])
    if version is None:
        raise unreadable(path, "its __version__ attribute is not a single value")
    version = float(version) if isinstance(version, (float, np.floating)) else version
    if version != VERSION and not (isinstance(version, float) and version < VERSION):
        raise unreadable(path, f"its layout version is {version!r}; cstream reads version {VERSION} "
                               "(and the layouts of cerebras.pytorch 2.0 and earlier, 0.1 to 0.4)")
    return version
