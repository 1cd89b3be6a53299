"""Checkpoints as local HDF5 files (any path without a URL scheme)."""

from __future__ import annotations

import os
import urllib.parse
from typing import Optional

import h5py

from cstream.appliance.storage.base_storage import StorageDeleter, StorageReader, StorageWriter


class H5Interface:
    @classmethod
    def is_valid_path(cls, path) -> bool:
        return urllib.parse.urlparse(str(path)).scheme == ""

    @classmethod
    def path_exists(cls, path) -> bool:
        return os.path.exists(path)


class H5Reader(H5Interface, StorageReader):
    """Reads an HDF5 checkpoint: its root attributes (``global_metadata``), its datasets' names
    (``keys()``) and a dataset's array and attributes (``read(key)``)."""

    def __init__(self, path: str):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist")
        if not h5py.is_hdf5(path):
            raise ValueError(f"{path} is not an HDF5 file")
        StorageReader.__init__(self, path)

    def stats(self) -> StorageReader.Stats:
        return StorageReader.Stats(path=self.path, st_mtime=os.stat(self.path).st_mtime)

    @property
    def global_metadata(self) -> dict:
        with h5py.File(self.path, "r") as f:
            return dict(f.attrs)

    def keys(self) -> list[str]:
        names = []
        with h5py.File(self.path, "r") as f:
            f.visititems(lambda name, obj: names.append(name)
                         if isinstance(obj, h5py.Dataset) else None)
        return names

    def read(self, key: Optional[str]):
        """``(array, attributes)`` of dataset ``key``; for None, ``(None, root attributes)``."""
        with h5py.File(self.path, "r") as f:
            if key is None:
                return None, dict(f.attrs)
            if key not in f:
                raise KeyError(f"{self.path} has no dataset {key!r}")
            return f[key][()], dict(f[key].attrs)


class H5Writer(H5Interface, StorageWriter):
    """Writes arrays and metadata into an HDF5 checkpoint."""

    def write_numpy(self, key: str, array, metadata: dict) -> None:
        with h5py.File(self.path, "a") as f:
            if key in f:
                del f[key]
            f.create_dataset(key, data=array)
            f[key].attrs.update(metadata or {})

    def write_metadata(self, key: Optional[str], metadata: dict) -> None:
        with h5py.File(self.path, "a") as f:
            (f.attrs if key is None else f.require_group(key).attrs).update(metadata)


class H5Deleter(H5Interface, StorageDeleter):
    def delete(self, key: Optional[str] = None) -> bool:
        if key is None:
            if not os.path.exists(self.path):
                return False
            os.remove(self.path)
            return True
        with h5py.File(self.path, "a") as f:
            if key not in f:
                return False
            del f[key]
            return True
