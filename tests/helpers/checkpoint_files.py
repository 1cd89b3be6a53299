"""Checkpoint files the tests need that cstream.save no longer writes."""

from __future__ import annotations

import zlib

import h5py
import numpy as np

from cstream.checkpoint import h5


def write_unsealed(obj, path) -> None:
    """A file as cstream 0.1 wrote it before it sealed its files: no user block, tensors
    uncompressed and contiguous, each with the CRC-32 of its values in ``cstream.crc32``."""
    h5.write(obj, path, writer="cstream 0.1.0", compress=False)
    with h5py.File(path, "r+") as f:
        for name, ds in f.items():
            if ds.attrs.get("__NUMPY__"):
                values = np.ascontiguousarray(ds[...]).view(np.uint8)
                ds.attrs["cstream.crc32"] = np.uint32(zlib.crc32(values))


def values_offset(path, name) -> int:
    """Where the dataset ``name``'s (first chunk of) values lie in the file at ``path``."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        return ds.id.get_offset() if ds.chunks is None else ds.id.get_chunk_info(0).byte_offset
