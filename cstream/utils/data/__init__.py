"""``cstream.utils.data``: DataLoader, DataExecutor, Schedule and the sharding helpers."""

from executor.data_executor import DataExecutor
from executor.schedule import Schedule
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.sharding import DistributedSampler as DistributedSampler
from workers.sharding import ParquetDataset as ParquetDataset
from workers.sharding import ShardedSampler as ShardedSampler
from workers.sharding import shard_iterable as shard_iterable

__all__ = [
    "DataExecutor", "DataLoader", "DistributedSampler", "EmptyDataLoaderError",
    "ParquetDataset", "Schedule", "ShardedSampler", "shard_iterable",
]
