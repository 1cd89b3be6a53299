"""The tasks of the (simulated) cluster: who streams, who is the master.

In the client (and on the CPU and GPU backends) there is one task, rank 0, the master. Inside an
input worker of the CSX backend the tasks are the ``num_csx * num_workers_per_csx`` input
workers, in global worker order, and the current rank is the worker's global id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from workers.context import get_worker_info, is_streamer


class TaskRole(Enum):
    MASTER = "master"
    WORKER = "worker"


@dataclass
class TaskSpec:
    """One task: its global ``rank``, ``local_rank`` on its CS-X, the CS-X (``wse_id``)."""

    rank: int
    local_rank: int
    wse_id: int
    node_name: str = "localhost"
    roles: List[TaskRole] = field(default_factory=list)

    def __post_init__(self):
        for name in ("rank", "local_rank", "wse_id"):
            if getattr(self, name) < 0:
                raise ValueError(f"TaskSpec.{name} must be >= 0, got {getattr(self, name)}.")


@dataclass
class ClusterSpec:
    """All tasks, the current task's ``rank``, ``num_csx`` and ``num_workers_per_csx``."""

    tasks: List[TaskSpec]
    rank: int
    num_csx: int
    num_workers_per_csx: int

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("ClusterSpec needs at least one task.")
        if not 0 <= self.rank < len(self.tasks):
            raise ValueError(f"ClusterSpec.rank {self.rank} is not in [0, {len(self.tasks)}).")
        ranks = [t.rank for t in self.tasks]
        if ranks != list(range(len(self.tasks))):
            raise ValueError(f"ClusterSpec task ranks must be 0..{len(ranks) - 1}, got {ranks}.")

    def num_tasks(self) -> int:
        return len(self.tasks)

    def task(self, rank: Optional[int] = None) -> TaskSpec:
        """The task of ``rank`` (default: the current task)."""
        rank = self.rank if rank is None else rank
        if not 0 <= rank < self.num_tasks():
            raise ValueError(
                f"Invalid task rank {rank}. Available ranks are: {list(range(self.num_tasks()))}."
            )
        return self.tasks[rank]

    def filter_tasks_by_role(self, role: TaskRole) -> List[TaskSpec]:
        return [t for t in self.tasks if role in t.roles]


def current_cluster_spec() -> ClusterSpec:
    """The cluster as the calling task sees it (see the module's docstring)."""
    if not is_streamer():
        return ClusterSpec([TaskSpec(0, 0, 0, roles=[TaskRole.MASTER])], 0, 1, 0)
    info = get_worker_info()
    W = info.num_workers_per_csx
    tasks = [TaskSpec(g, g % W, g // W, roles=[TaskRole.WORKER])
             for g in range(info.total_num_workers)]
    return ClusterSpec(tasks, info.global_worker_id, info.num_csx, W)


class ClusterResolver:
    """The current cluster spec and the current task (what ``service_resolver()`` holds)."""

    @property
    def cluster_spec(self) -> ClusterSpec:
        return current_cluster_spec()

    @property
    def num_tasks(self) -> int:
        return self.cluster_spec.num_tasks()

    @property
    def rank(self) -> int:
        return self.cluster_spec.rank

    @property
    def task(self) -> TaskSpec:
        return self.cluster_spec.task()

    def assumes_role(self, role: TaskRole, rank: Optional[int] = None) -> bool:
        return role in self.cluster_spec.task(rank).roles
