"""``PyTorchH5Saver``: the checkpoint class Model Zoo tools of Release 2.0-2.2 call, over
:func:`cstream.save` and :func:`cstream.load` (the same files, either layout they read).

A tensor's *name* is its path in the saved structure with dots: ``model.fc.weight`` for
``{"model": {"fc.weight": t}}`` and ``state.0`` for ``{"state": [t]}``.
"""

from __future__ import annotations

import dataclasses

import h5py
import torch

from cstream.checkpoint import saving
from cstream.checkpoint.lazy import CheckpointError


def _flatten(obj, prefix: str, out: list) -> list:
    if isinstance(obj, dict):
        for key, value in obj.items():
            _flatten(value, f"{prefix}{key}.", out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _flatten(value, f"{prefix}{i}.", out)
    else:
        out.append((prefix[:-1], obj))
    return out


@dataclasses.dataclass(frozen=True)
class CheckpointVersion:
    """What :meth:`PyTorchH5Saver.extract_version` reads from a checkpoint."""

    ckpt_version: float
    """The layout version of the file."""
    written_by: str
    """The package and version that wrote it, as the file says ("" where it does not)."""


class PyTorchH5Saver:
    """Reads and writes checkpoints as ``cerebras.pytorch`` 2.0's saver class did."""

    @staticmethod
    def is_valid_checkpoint(path) -> bool:
        """Whether ``path`` is a checkpoint file :func:`cstream.load` reads."""
        try:
            return h5py.is_hdf5(path) and bool(saving.layout(path))
        except (OSError, ValueError, CheckpointError):
            return False

    @staticmethod
    def extract_version(path) -> CheckpointVersion:
        """The layout version written in the file (``ckpt_version`` 0.5 for what cstream writes)
        and who wrote it: Release 2.1's flow reads ``.ckpt_version`` to tell checkpoints
        written before 2.0 (0.3 and older) apart."""
        description = saving.layout(path)  # "cerebras.pytorch layout 0.5, written by ..."
        head, _, writer = description.partition(", written by ")
        version = head.rsplit(" ", 1)[-1].rstrip(")")
        try:
            return CheckpointVersion(float(version), writer.strip())
        except ValueError:
            raise CheckpointError(f"{path}: no layout version in {description!r}.") from None

    @staticmethod
    def flatten_state_dict(state_dict) -> list:
        """``(name, value)`` for every leaf of ``state_dict``, names dotted as above."""
        return _flatten(state_dict, "", [])

    def save(self, path, state_dict) -> None:
        saving.save(state_dict, path)

    def load(self, path, map_location=None):
        return saving.load(path, map_location=map_location)

    def tensor_names(self, path) -> list:
        """The names of the tensors in the checkpoint at ``path``, in file order."""
        return [name for name, value in self.flatten_state_dict(saving.load(path))
                if isinstance(value, torch.Tensor)]

    def load_tensor(self, path, name: str) -> torch.Tensor:
        """The tensor called ``name`` (see :meth:`tensor_names`) in the checkpoint at ``path``."""
        for key, value in self.flatten_state_dict(saving.load(path)):
            if key == name:
                return value
        raise KeyError(f"{path} has no tensor named {name!r}; its tensors: "
                       f"{self.tensor_names(path)[:20]}")
