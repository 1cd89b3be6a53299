"""``cerebras.appliance.storage``: checkpoint storage by kind of path (local HDF5 files; S3
recognised and not simulated)."""

from cstream.appliance.storage import base_storage, h5_storage, s3_storage
from cstream.appliance.storage.base_storage import StorageDeleter, StorageReader, StorageWriter
from cstream.appliance.storage.h5_storage import H5Deleter, H5Reader, H5Writer
from cstream.appliance.storage.s3_storage import S3Deleter, S3Reader, S3Writer

__all__ = ["H5Deleter", "H5Reader", "H5Writer", "S3Deleter", "S3Reader", "S3Writer",
           "StorageDeleter", "StorageReader", "StorageWriter", "base_storage", "h5_storage",
           "s3_storage"]
