"""The input side of cstream: worker context, configuration, and the Ray input workers."""

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint, WorkerInfo, get_worker_info, worker_context

__all__ = ["CSConfig", "DataLoaderCheckpoint", "WorkerInfo", "get_worker_info", "worker_context"]
