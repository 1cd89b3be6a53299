"""Worker identity for ``input_fn``: which CS-X and which worker am I?

``get_worker_info()`` is cstream's; the other functions are the Cerebras API's, answered from the
same worker context. In the client (and on the CPU/GPU backends, where ``input_fn`` runs in the
client) there is one task, the master, which does not stream: ``is_streamer()`` is False,
``num_streamers()`` 0. Inside an input worker of the CSX backend (and the DataLoader worker
processes it forks) the tasks are the ``num_csx * num_workers_per_csx`` input workers:
``is_streamer()`` is True and ``get_streaming_rank()`` is the worker's global id.

>>> import cstream.distributed as dist
>>> dist.is_streamer(), dist.num_streamers(), dist.get_ordinal(), dist.is_master_ordinal()
(False, 0, 0, True)
>>> from workers.context import WorkerInfo, worker_context, streamer_context
>>> info = WorkerInfo(local_worker_id=1, num_workers_per_csx=2, num_csx=2, wse_id=1)
>>> with worker_context(info), streamer_context():
...     dist.get_streaming_rank(), dist.num_streamers(), dist.get_streaming_batch_size(9)
(3, 4, 4)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from cstream.distributed import cluster_config, cluster_resolver
from cstream.distributed.cluster_config import ClusterConfig
from cstream.distributed.cluster_resolver import TaskRole
from cstream.distributed.service_resolver import service_resolver
from workers.context import (DataLoaderCheckpoint, WorkerInfo, get_worker_info, get_worker_state,
                             is_streamer)

WORKER_CACHE_ROOT = "/n0/cache"
"""Where a Cerebras cluster's workers cache datasets; cstream has no worker cache (see
:func:`hit_worker_cache_limit`)."""
SSD_LIMIT = 0.8


def num_tasks() -> int:
    """Tasks in the cluster: 1 in the client, the input workers in a worker."""
    return service_resolver().cluster_resolver.num_tasks


def num_streamers() -> int:
    """Tasks that stream inputs (0 in the client)."""
    return len(service_resolver().streamer_ordinals())


def num_receivers() -> int:
    return len(service_resolver().receiver_ordinals())


def get_ordinal() -> int:
    """The current task's rank."""
    return service_resolver().cluster_resolver.rank


def get_streaming_rank() -> int:
    """The current task's rank among the streamers (an input worker's global id)."""
    if not is_streamer():
        raise RuntimeError(
            "get_streaming_rank() is called in a task that does not stream inputs (the client, "
            "or input_fn on the CPU/GPU backend). Guard it with "
            "cerebras.pytorch.distributed.is_streamer()."
        )
    return sorted(service_resolver().streamer_ordinals()).index(get_ordinal())


def get_streaming_batch_size(effective_batch_size: int, global_rank: Optional[int] = None) -> int:
    """The batch size one CS-X receives when the global batch is ``effective_batch_size``.

    In an input worker: the CS-X's slice of the global batch (``num_csx`` slices, the first
    ``effective_batch_size % num_csx`` one larger), for the worker ``global_rank`` (default: the
    current one). Elsewhere: ``effective_batch_size`` itself.
    """
    if isinstance(effective_batch_size, bool) or not isinstance(effective_batch_size, int):
        raise TypeError(
            f"Expected effective batch size to be an integer, but got type "
            f"{type(effective_batch_size)} with value {effective_batch_size}."
        )
    if effective_batch_size <= 0:
        raise ValueError(
            f"Expected effective batch size to be a positive integer, but got value "
            f"{effective_batch_size}."
        )
    if not is_streamer():
        return effective_batch_size
    spec = service_resolver().cluster_spec
    per, extra = divmod(effective_batch_size, spec.num_csx)
    return per + (1 if spec.task(global_rank).wse_id < extra else 0)


def is_master_ordinal(local: bool = False) -> bool:
    """True in the client (the master task), False in an input worker."""
    return service_resolver().cluster_resolver.assumes_role(TaskRole.MASTER)


def is_receiver() -> bool:
    return get_ordinal() in service_resolver().receiver_ordinals()


def _torch_distributed():
    import torch.distributed as td

    return td if td.is_available() and td.is_initialized() else None


def get_world_size() -> int:
    """Processes of an initialised ``torch.distributed`` group (Release 2.0 flows call it on
    GPU with DDP); without one, :func:`num_tasks`."""
    td = _torch_distributed()
    return td.get_world_size() if td is not None else num_tasks()


def get_rank() -> int:
    """This process's rank in an initialised ``torch.distributed`` group; without one,
    :func:`get_ordinal`."""
    td = _torch_distributed()
    return td.get_rank() if td is not None else get_ordinal()


def hit_worker_cache_limit(src_dir: str, dest_dir: str):
    """Whether copying ``src_dir`` into ``dest_dir`` (under :data:`WORKER_CACHE_ROOT`) would
    fill the cache past :data:`SSD_LIMIT` of its disk: ``(is_limit_hit, dir_size,
    available_space_for_copy)``, as on a Cerebras cluster, measured on this machine's disk."""
    Path(dest_dir).resolve().relative_to(Path(WORKER_CACHE_ROOT).resolve())
    if not os.path.isdir(WORKER_CACHE_ROOT):
        raise FileNotFoundError(
            f"the worker cache {WORKER_CACHE_ROOT} does not exist on this machine: it is a "
            "Cerebras cluster's worker disk, which cstream does not simulate. Set "
            "use_worker_cache: False in the input configuration.")
    usage = shutil.disk_usage(WORKER_CACHE_ROOT)
    dir_size = sum(f.stat().st_size for f in Path(src_dir).rglob("*") if f.is_file())
    cached = sum(f.stat().st_size for f in Path(dest_dir).rglob("*") if f.is_file()) \
        if os.path.isdir(dest_dir) else 0
    available = usage.total * SSD_LIMIT - (usage.used - cached)
    return dir_size > available, dir_size, available


__all__ = [
    "ClusterConfig", "DataLoaderCheckpoint", "SSD_LIMIT", "WORKER_CACHE_ROOT", "WorkerInfo", "cluster_config",
    "cluster_resolver",
    "get_ordinal", "get_rank", "get_streaming_batch_size", "get_streaming_rank",
    "get_worker_info", "get_worker_state", "get_world_size", "hit_worker_cache_limit",
    "is_master_ordinal", "is_receiver", "is_streamer", "num_receivers", "num_streamers",
    "num_tasks", "service_resolver",
]
