"""What a loader ``input_fn`` returned can do under the input side's assignments: whether its
global batches can be assigned to the workers dynamically (:func:`dynamic_assignment_support`),
how many an epoch has (:func:`global_batches_per_epoch`), how many index batches it draws
ahead of the one it yields (:func:`draws_ahead`), and whether a stream reading it can change
its workers while it runs (:func:`worker_change_support`)."""

from __future__ import annotations

import torch

from workers.parquet import ParquetDataset
from workers.resume import restartable_part
from workers.sharding import ShardedSampler

__all__ = ["draws_ahead", "dynamic_assignment_support", "global_batches_per_epoch",
           "sharded_sampler_of", "worker_change_support"]


def sharded_sampler_of(loader) -> ShardedSampler | None:
    """The :class:`ShardedSampler` ``loader`` draws its batches from: the loader itself, its
    ``batch_sampler`` or ``sampler``, or the ``sampler`` that such a part wraps (a user's
    prefetching wrapper keeps the sampler it reads from as ``.sampler``, as torch's
    ``BatchSampler`` does)."""
    parts = [loader] + [getattr(loader, name, None) for name in ("batch_sampler", "sampler")]
    parts += [getattr(p, "sampler", None) for p in parts[1:] if p is not None]
    return next((p for p in parts if isinstance(p, ShardedSampler)), None)


def dynamic_assignment_support(loader) -> tuple[bool, str]:
    """Whether the batches of ``loader`` (what ``input_fn`` returned) can be assigned to the
    workers dynamically, and why (or why not).

    They can when the loader draws its batches from a :class:`ShardedSampler` (the loader
    itself, its ``batch_sampler`` / ``sampler``, or a wrapper's ``.sampler``) whose global
    batches have a length, and yields them in the order it draws them, or reads them from a
    :class:`ParquetDataset` in its own process: then any worker can produce any global batch.
    Iterable datasets and other samplers decide in the worker which batches it yields, and a
    torch ``DataLoader(in_order=False)`` yields batches in the order its processes finish them,
    so they keep the round-robin (static) assignment. Loaders that draw index batches ahead of
    use take part: see :func:`draws_ahead`. A RestartableDataLoader (``aggregate_state_dict``)
    keeps the round-robin too: its state is the aggregate of each worker's own state, which means
    the batches that worker took, in the order the round-robin gave them."""
    if callable(getattr(loader, "aggregate_state_dict", None)):
        return False, (f"the loader input_fn returned ({type(loader).__name__}) aggregates its "
                       "input workers' own states (aggregate_state_dict), each of which counts "
                       "the batches that worker took in round-robin order")
    parquet = loader if isinstance(loader, ParquetDataset) else getattr(loader, "dataset", None)
    if isinstance(parquet, ParquetDataset):
        processes = getattr(loader, "num_workers", 0) or 0
        if processes:
            return False, (f"the ParquetDataset is read by a torch DataLoader with num_workers="
                           f"{processes}, whose worker processes cannot be given batch "
                           "numbers; round-robin delivers the same sequence")
        return True, "the loader reads its global batches from a ParquetDataset"
    sampler = sharded_sampler_of(loader)
    if sampler is None:
        return False, (f"the loader input_fn returned ({type(loader).__name__}) does not draw "
                       "its batches from a cstream ShardedSampler (an iterable dataset or "
                       "another sampler decides in each worker which batches it yields)")
    try:
        len(sampler.data_source)
    except TypeError:
        return False, (f"the ShardedSampler's data source ({type(sampler.data_source).__name__})"
                       " has no len(), so global batch numbers cannot be placed in epochs")
    if getattr(loader, "in_order", True) is False and getattr(loader, "num_workers", 0):
        return False, ("the torch DataLoader has in_order=False, so it yields batches in the "
                       "order its worker processes finish them, not in the order it drew their "
                       "global batch numbers; leave in_order=True for dynamic assignment")
    return True, "the loader draws its global batches from a ShardedSampler"


def global_batches_per_epoch(loader) -> int:
    """The global batches of one epoch of a loader that takes part in dynamic assignment
    (:func:`dynamic_assignment_support`): its ShardedSampler's, or its ParquetDataset's."""
    parquet = loader if isinstance(loader, ParquetDataset) else getattr(loader, "dataset", None)
    if isinstance(parquet, ParquetDataset):
        return parquet.num_global_batches
    return len(sharded_sampler_of(loader).data_source)


def draws_ahead(loader) -> int:
    """How many index batches ``loader`` draws beyond the batch it yields: a torch
    ``DataLoader`` with ``num_workers = n > 0`` draws ``prefetch_factor * n`` when its
    iterator is created (or re-armed, with ``persistent_workers``) and one more before it
    yields each batch; one with ``num_workers=0`` draws none ahead. Under dynamic assignment
    a worker must hold that many global batch numbers beyond the one it produces, or its
    loader waits for numbers before it yields the batch the stream waits for. A sampler
    wrapper's own read-ahead cannot be seen from outside: the input worker reports it when
    its loader waits for a number with batches drawn and not yet yielded
    (:class:`workers.context.BatchAssignment`)."""
    n = getattr(loader, "num_workers", 0)
    if not isinstance(loader, torch.utils.data.DataLoader) or not n:
        return 0
    return int(getattr(loader, "prefetch_factor", None) or 2) * int(n)


def worker_change_support(loader) -> tuple[bool, str]:
    """Whether a round-robin stream reading ``loader`` can change its workers while it runs,
    and why (or why not): it re-forms its workers from the exact position at a step boundary,
    as a resume with another worker count does, which needs a position in global-batch units
    (:meth:`workers.resume.ResumeStates.remap`): the loader's restartable part
    (:func:`workers.resume.restartable_part`) is a :class:`ShardedSampler` or a
    :class:`ParquetDataset` read in the input worker's own process. A dynamic assignment takes
    in and lets go of workers whatever its loaders (they all take part,
    :func:`dynamic_assignment_support`)."""
    part = restartable_part(loader)
    if part is not None and isinstance(part[1], (ShardedSampler, ParquetDataset)):
        return True, f"the loader keeps its position in global batches ({part[0]}: " \
            f"{type(part[1]).__name__})"
    if isinstance(getattr(loader, "dataset", None), ParquetDataset):
        return False, (f"the ParquetDataset is read by a torch DataLoader with num_workers="
                       f"{getattr(loader, 'num_workers', 0)}: each process keeps its own place "
                       "in it, so a worker's position counts its own batches, which another "
                       "worker count cannot continue from")
    return False, (f"the loader input_fn returned ({type(loader).__name__}) keeps a position of "
                   "its own shard (a DistributedSampler, shard_iterable, an iterable dataset, or "
                   "another sampler), which another worker count cannot continue from exactly; "
                   "draw its batches from a cstream ShardedSampler or a ParquetDataset")
