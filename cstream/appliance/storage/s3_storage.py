"""Checkpoints in S3 (``s3://`` URLs): recognised, not reached. cstream runs on one machine and
stores checkpoints in local files; opening an S3 checkpoint raises UnsupportedFeatureError."""

from __future__ import annotations

import urllib.parse

from cstream.appliance.storage.base_storage import StorageDeleter, StorageReader, StorageWriter
from cstream.unsupported import unsupported

_S3 = unsupported("checkpoint storage in S3 (an s3:// checkpoint path)")


class S3Interface:
    @classmethod
    def is_valid_path(cls, path) -> bool:
        return urllib.parse.urlparse(str(path)).scheme == "s3"

    @classmethod
    def path_exists(cls, path) -> bool:
        return _S3()

    def __init__(self, path, *args, **kwargs):
        _S3()


class S3Reader(S3Interface, StorageReader):
    pass


class S3Writer(S3Interface, StorageWriter):
    pass


class S3Deleter(S3Interface, StorageDeleter):
    pass
