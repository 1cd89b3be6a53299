"""A run resumed from a RestartableDataLoader aggregate: what ``DataLoader.state_dict()``
returns for a loader with the Cerebras protocol (``state_dict`` / ``load_state_dict`` and
``aggregate_state_dict`` / ``deaggregate_state_dict``), from this stack or the Cerebras one.

Every input worker of the resumed run starts by loading its own ``deaggregate_state_dict()`` of
the aggregate (the position key ``loader_aggregate``, :class:`workers.resume.Source`). Where the
loaders keep their own per-worker places (the Model Zoo's iterable HDF5 loaders), the run's
round-robin starts again at worker 0, as it does on the Cerebras stack. Where they draw from a
:class:`~workers.sharding.ShardedSampler` (the Model Zoo's map-style loaders, through
``DistributedSampler.set_state``), every worker resumes at one global batch, and the run
continues the numbering from there: the step at that global batch comes from the worker the
uninterrupted run would have taken it from.
"""

from __future__ import annotations

import copy
from typing import Any

from workers.context import DataLoaderCheckpoint, WorkerInfo, worker_context
from workers.dataloader import DataLoader
from workers.loaders import global_batches_per_epoch, sharded_sampler_of
from workers.positions import RoundRobinOrder
from workers.resume import load_aggregate, restartable_part


def run_resume_states(dataloader: DataLoader, num_csx: int,
                      num_workers_per_csx: int) -> list[DataLoaderCheckpoint] | None:
    """Every worker's saved state the next run of ``dataloader`` resumes from, for a run of
    ``num_csx`` CS-Xs of ``num_workers_per_csx`` workers: the states given to
    ``load_state_dict``, or, for an aggregate, each worker at the step the aggregate resumes
    at, with the aggregate to load; None: the run starts from the beginning."""
    aggregate = dataloader.resume_aggregate
    if aggregate is None:
        return dataloader.resume_states
    step, epoch = resumed_at(dataloader, aggregate)
    W = num_workers_per_csx
    order = RoundRobinOrder(W)
    return [DataLoaderCheckpoint(
        local_worker_id=w, num_workers_per_csx=W, num_csx=num_csx, wse_id=c,
        appliance_step=step, worker_step=order.batches_of(w, step),
        user_state_dict={"epoch": epoch, "batch_in_epoch": 0,
                         "loader_aggregate": copy.deepcopy(aggregate)})
        for c in range(num_csx) for w in range(W)]


def resumed_at(dataloader: DataLoader, aggregate: Any) -> tuple[int, int]:
    """(global batch, epoch) where the workers' loaders resume once they load ``aggregate``:
    (0, 0) for loaders that keep their own places; for a loader that draws from a
    ShardedSampler, where the sampler of a loader built here (worker 0 of 1) stands after it
    loads the aggregate."""
    if sharded_sampler_of(dataloader.client_loader()) is None:
        return 0, 0
    loader = dataloader.build(WorkerInfo())  # a loader of its own: the client's stays as it is
    part = restartable_part(loader)
    with worker_context(WorkerInfo()):
        load_aggregate(part[1] if part else loader, aggregate, dataloader)
    state = sharded_sampler_of(loader).state_dict()
    epoch = int(state["epoch"])
    return epoch * global_batches_per_epoch(loader) + int(state["next_global_batch"]), epoch
