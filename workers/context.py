"""Which shard am I? The worker context seen by ``input_fn``.

Inside an input worker, :func:`get_worker_info` tells the user's ``input_fn`` which CS-X it feeds
and which worker of that CS-X it is; in the client and on the CPU backend it reports worker 0 of 1.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerInfo:
    """Identity of one input worker (names follow the Cerebras ``DataLoaderCheckpoint``)."""

    local_worker_id: int = 0
    num_workers_per_csx: int = 1
    num_csx: int = 1
    wse_id: int = 0

    @property
    def global_worker_id(self) -> int:
        return self.wse_id * self.num_workers_per_csx + self.local_worker_id

    @property
    def total_num_workers(self) -> int:
        return self.num_csx * self.num_workers_per_csx


@dataclass
class DataLoaderCheckpoint:
    """The state of one input worker at a checkpoint step (Cerebras API names)."""

    local_worker_id: int = 0
    num_workers_per_csx: int = 1
    num_csx: int = 1
    wse_id: int = 0
    appliance_step: int = 0
    worker_step: int = 0
    samples_streamed: int = 0
    user_state_dict: dict = field(default_factory=dict)

    @property
    def global_worker_id(self) -> int:
        return self.wse_id * self.num_workers_per_csx + self.local_worker_id

    @property
    def total_num_workers(self) -> int:
        return self.num_csx * self.num_workers_per_csx


_DEFAULT = WorkerInfo()
_local = threading.local()


def get_worker_info() -> WorkerInfo:
    """Return the calling input worker's identity (worker 0 of 1 outside a worker)."""
    return getattr(_local, "info", _DEFAULT)


def get_worker_state() -> DataLoaderCheckpoint:
    """Return the calling worker's streaming state (inside a checkpoint's state gathering)."""
    state = getattr(_local, "state", None)
    if state is None:
        info = get_worker_info()
        state = DataLoaderCheckpoint(
            local_worker_id=info.local_worker_id,
            num_workers_per_csx=info.num_workers_per_csx,
            num_csx=info.num_csx,
            wse_id=info.wse_id,
        )
    return state


@contextlib.contextmanager
def worker_context(info: WorkerInfo, state: DataLoaderCheckpoint | None = None):
    """Run a block as the given worker: ``get_worker_info()`` returns ``info`` inside it."""
    prev_info = getattr(_local, "info", _DEFAULT)
    prev_state = getattr(_local, "state", None)
    _local.info = info
    _local.state = state
    try:
        yield info
    finally:
        _local.info = prev_info
        _local.state = prev_state
