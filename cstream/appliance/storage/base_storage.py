"""Where checkpoints are stored: a reader, writer and deleter per kind of path.

``StorageReader.get(path)`` (and the writer's and deleter's) picks the subclass whose
``is_valid_path(path)`` holds: local files (:mod:`.h5_storage`) or S3 URLs
(:mod:`.s3_storage`, which cstream does not reach). ``StorageWriter.path_exists(path)`` asks the
subclasses that handle the path.

>>> StorageWriter.is_valid_path("model_dir/checkpoint_10.mdl"), StorageWriter.path_exists("/nonexistent")
(True, False)
>>> StorageReader.get_type("s3://bucket/ckpt.mdl").__name__
'S3Reader'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cstream.appliance.utils.classes import retrieve_all_subclasses


class _Storage:
    def __init__(self, path: str):
        self._path = path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @property
    def path(self) -> str:
        return self._path

    @classmethod
    def get_subclasses(cls):
        yield from retrieve_all_subclasses(cls)

    @classmethod
    def is_valid_path(cls, path: str) -> bool:
        """Whether some subclass handles ``path``."""
        return any(sub.is_valid_path(path) for sub in cls.get_subclasses())

    @classmethod
    def path_exists(cls, path: str) -> bool:
        """Whether ``path`` exists, for a subclass that handles it."""
        return any(sub.path_exists(path) for sub in cls.get_subclasses()
                   if sub.is_valid_path(path))

    @classmethod
    def construct(cls, path, *args, **kwargs):
        return cls(path, *args, **kwargs)

    @classmethod
    def get_type(cls, path) -> type:
        """The one subclass that handles ``path``; an error when none or several do."""
        path = str(path)
        matches = [sub for sub in cls.get_subclasses() if sub.is_valid_path(path)]
        if not matches:
            raise ValueError(f"Could not find {cls.__name__} for invalid path: {path}")
        if len(matches) > 1:
            raise ValueError(
                f"Multiple {cls.__name__}s found for path: {path}.\n"
                f"{sorted(sub.__name__ for sub in matches)}\n"
                f"Please ensure that all {cls.__name__} are unique.")
        return matches[0]

    @classmethod
    def get(cls, path, *args, **kwargs):
        return cls.get_type(path).construct(path, *args, **kwargs)


class StorageReader(_Storage):
    @dataclass
    class Stats:
        path: str
        st_mtime: float

    def exists(self) -> bool:
        return self.path_exists(self.path)

    def stats(self) -> "StorageReader.Stats":
        raise NotImplementedError

    def read(self, key: Optional[str]):
        raise NotImplementedError


class StorageWriter(_Storage):
    @classmethod
    def get(cls, path, *args, **kwargs):
        writer = super().get(path, *args, **kwargs)
        if writer.path_exists(path):
            raise FileExistsError(f"Checkpoint at '{path}' already exists. Please delete the "
                                  f"checkpoint and run again.")
        return writer


class StorageDeleter(_Storage):
    def delete(self, key: Optional[str] = None) -> bool:
        """Delete ``key`` of the checkpoint, or all of it for None; True if something was."""
        raise NotImplementedError
