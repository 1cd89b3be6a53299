"""Worker identity for ``input_fn``: which CS-X and which worker am I?"""

from workers.context import DataLoaderCheckpoint, WorkerInfo, get_worker_info, get_worker_state

__all__ = ["DataLoaderCheckpoint", "WorkerInfo", "get_worker_info", "get_worker_state"]
