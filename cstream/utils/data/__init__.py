"""``cstream.utils.data``: DataLoader, DataExecutor, Schedule and the sharding helpers."""

from executor.data_executor import DataExecutor
from executor.schedule import Schedule
from workers.dataloader import DataLoader, EmptyDataLoaderError

__all__ = ["DataExecutor", "DataLoader", "EmptyDataLoaderError", "Schedule"]
