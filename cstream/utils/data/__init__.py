"""``cstream.utils.data``: DataLoader, DataExecutor, Schedule and the sharding helpers."""

from executor.data_executor import DataExecutor
from executor.schedule import Schedule
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.sharding import DistributedSampler as DistributedSampler
from workers.parquet import ParquetDataset as ParquetDataset
from workers.sharding import ShardedSampler as ShardedSampler
from workers.sharding import shard_iterable as shard_iterable
from cstream.utils.data import data_executor, dataset, sampler, utils
from cstream.utils.data.dataset import SyntheticDataset
from cstream.utils.data.utils import compute_num_steps, from_numpy, to_numpy

__all__ = [
    "DataExecutor", "DataLoader", "DistributedSampler", "EmptyDataLoaderError",
    "ParquetDataset", "Schedule", "ShardedSampler", "SyntheticDataset", "compute_num_steps",
    "data_executor", "dataset", "from_numpy", "sampler", "shard_iterable",
    "to_numpy", "utils",
]
