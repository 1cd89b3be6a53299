"""Data-sharding schemes: give each input worker its own part of the data.

Every input worker calls the same ``input_fn`` inside its own worker context. The classes here read
:func:`workers.context.get_worker_info` when they are *iterated* (not when they are built), so an
``input_fn`` that builds them gives each worker its shard, and the client / CPU backend (worker 0
of 1) sees the whole data set.

Notation: ``C`` = ``num_csx``, ``W`` = ``num_workers_per_csx``, ``T = C * W`` =
``total_num_workers``, global worker ``g = wse_id * W + local_worker_id``.

- :class:`ShardedSampler` keeps the *global batches* of a batch sampler: at step ``s`` the wafer
  consumes global batch ``s``; worker ``s % W`` of every CS-X produced it, each CS-X its own
  contiguous slice. The simulated wafer thus sees the same sequence of global batches as the CPU
  backend.
- :class:`DistributedSampler` interleaves samples over all ``T`` workers, as
  ``torch.utils.data.DistributedSampler(num_replicas=T, rank=g)`` does.
- :func:`shard_iterable` keeps every ``T``-th item of any iterable, starting at ``g``.
- :class:`workers.parquet.ParquetDataset` makes global batches of the rows of Parquet files and deals them out
  as :class:`ShardedSampler` does.
"""

from __future__ import annotations

import array
import collections
import functools
import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from workers.context import (AssignmentClosed, get_batch_assignment, get_worker_info,
                             is_streamer)
from workers.global_batches import BatchSampler, ShuffleSampler

__all__ = ["DistributedSampler", "ShardedSampler", "shard_iterable"]


def slice_bounds(n: int, parts: int, part: int) -> tuple[int, int]:
    """``[start, stop)`` of slice ``part`` when ``n`` items are cut into ``parts`` contiguous
    slices as equal as possible (the first ``n % parts`` one larger, like ``torch.tensor_split``)."""
    q, r = divmod(n, parts)
    start = part * q + min(part, r)
    return start, start + q + (1 if part < r else 0)


def count_congruent(n: int, start: int, step: int) -> int:
    """How many of ``0..n-1`` are ``start, start + step, ...``."""
    return 0 if n <= start else (n - start + step - 1) // step


def _batch_bytes(batch) -> bytes:
    """The indices of one global batch as bytes (for the order digest)."""
    if isinstance(batch, torch.Tensor):
        return batch.detach().cpu().to(torch.int64).numpy().tobytes()
    try:
        return array.array("q", batch).tobytes()
    except (TypeError, OverflowError):
        return repr(list(batch)).encode()


def check_int(name: str, value: Any, minimum: int, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}.")
    return value


def check_state(owner: str, state: Any, keys: Sequence[str]) -> dict:
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ValueError(
            f"{owner}.load_state_dict expects what {owner}.state_dict() returned (a dict with "
            f"keys {list(keys)}), got {state!r}."
        )
    for k in keys:
        check_int(f"state_dict[{k!r}]", state[k], 0, f"{owner}.load_state_dict")
    return state


# ---------------------------------------------------------------------------------------------
# ShardedSampler: global batches, round-robin over the workers of a CS-X, sliced over CS-Xs
# ---------------------------------------------------------------------------------------------

class ShardedSampler:
    """A batch sampler that gives each input worker its share of every global batch.

    ``data_source`` yields global batches of sample indices (a ``torch.utils.data.BatchSampler``
    or any re-iterable of index lists). Worker ``w`` of CS-X ``c`` takes global batches
    ``w, w + W, w + 2W, ...`` -- numbered across epochs, so the round-robin carries on from one
    epoch into the next when the epoch length is not a multiple of ``W`` -- and of each only
    CS-X ``c``'s contiguous slice (the slices of one
    batch differ in size by at most one; the first ``len(batch) % C`` are one larger). Reading
    the input workers round-robin (step ``s``: worker ``s % W`` of each CS-X) and concatenating
    the CS-X slices in order gives back exactly the global batches, in order. Worker 0 of 1 (the
    client, the CPU backend) gets the global batches unchanged.

    The worker identity is read from :func:`cstream.distributed.get_worker_info` each time the
    sampler is iterated, so build it inside ``input_fn`` and pass it as ``batch_sampler=``.

    ``state_dict()`` is ``{"next_global_batch": n, "epoch": e, "order_digest": d}``: ``n`` is the
    global batch index right after the last batch this worker yielded (global-batch units, so it
    does not depend on the number of workers), ``d`` a digest of global batches ``0..n-1``.
    After ``load_state_dict``, the next iteration starts with this worker's first global batch
    at or after ``n``, for any ``W`` and ``C``; if the global batches before ``n`` are not the
    ones the saved run walked (a shuffle that cannot be drawn again), it raises instead of
    streaming a different order that would repeat some samples and skip others.

    A loader may draw index batches *ahead* of the batches it yields (a torch ``DataLoader``
    with ``num_workers > 0`` draws ``prefetch_factor * num_workers`` of them when its iterator
    is created; a prefetching sampler wrapper draws its own). Once :meth:`track_production`
    was called (:class:`workers.resume.Source` does, and calls :meth:`batch_produced` for
    every batch the loader yields), ``state_dict()`` describes the position after the last
    batch the loader *yielded*, not after the last index batch drawn, so a resume neither
    skips the batches drawn ahead nor repeats any.

    >>> import torch
    >>> from torch.utils.data import BatchSampler, SequentialSampler
    >>> from workers.context import WorkerInfo, worker_context
    >>> sampler = ShardedSampler(BatchSampler(SequentialSampler(range(12)), 3, drop_last=False))
    >>> list(sampler)  # worker 0 of 1: the global batches
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    >>> with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2, num_csx=2, wse_id=1)):
    ...     list(sampler)  # global batches 1 and 3, second half of each
    [[5], [11]]
    """

    def __init__(self, data_source: Iterable):
        if not hasattr(data_source, "__iter__"):
            raise TypeError(
                f"ShardedSampler expects data_source to be an iterable of global batches of "
                f"indices (e.g. torch.utils.data.BatchSampler(sampler, batch_size, drop_last)), "
                f"got {type(data_source).__name__}: {data_source!r}."
            )
        if isinstance(data_source, Iterator):
            raise TypeError(
                f"ShardedSampler: data_source is a one-shot iterator ({type(data_source).__name__}), "
                "which would be empty from the second epoch on. Pass a re-iterable object such as "
                "a torch.utils.data.BatchSampler or a list of index lists."
            )
        self.data_source = data_source
        self.epoch = 0
        self._next = 0  # the global batch index after the last one yielded
        self._digest: str | None = None  # of global batches 0.._next-1
        self._resume_from: int | None = None
        self._resume_digest: str | None = None
        self.skipped_epoch = False  # the last epoch yielded nothing on purpose (dynamic)
        # production tracking (track_production): the states after the batches yielded and
        # not yet produced by the loader, oldest first, and the state after the last produced
        self._tracking = False
        self._drawn: collections.deque = collections.deque()
        self._produced_state: tuple[int, str | None] = (0, None)

    def _epoch_target(self):
        if callable(getattr(self.data_source, "set_epoch", None)):
            return self.data_source
        inner = getattr(self.data_source, "sampler", None)
        if callable(getattr(inner, "set_epoch", None)):
            return inner
        return None

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` and forward it to the data source (or its ``sampler``) if it has
        ``set_epoch``, so every worker draws the same shuffled global batches."""
        self.epoch = check_int("epoch", epoch, 0, "ShardedSampler.set_epoch")
        target = self._epoch_target()
        if target is not None:
            target.set_epoch(epoch)

    def __len__(self) -> int:
        """The number of batches this worker yields in a full epoch."""
        info = get_worker_info()
        W = info.num_workers_per_csx
        n = len(self.data_source)
        first = (info.local_worker_id - self._offset(n, W)) % W
        return count_congruent(n, first, W)

    def _offset(self, n, W: int) -> int:
        """Global batches numbered before this epoch (so the round-robin continues across
        epochs even when the epoch length is not a multiple of W)."""
        return 0 if n is None else (self.epoch * n) % W

    def __iter__(self) -> Iterator:
        assignment = get_batch_assignment()
        if assignment is not None:
            return self._iter_assigned(assignment)
        return self._iter_round_robin()

    def _iter_round_robin(self) -> Iterator:
        info = get_worker_info()
        W, C, w, c = info.num_workers_per_csx, info.num_csx, info.local_worker_id, info.wse_id
        start = self._resume_from or 0
        expected, self._resume_from, self._resume_digest = self._resume_digest, None, None
        self._start_iteration(start, expected)
        try:
            offset = self._offset(len(self.data_source), W)
        except TypeError:
            offset = 0
        order = hashlib.blake2b(digest_size=16)
        index = -1
        for index, batch in enumerate(self.data_source):
            if index == start and expected is not None:
                self._check_order(order.hexdigest(), expected, start)
            if not hasattr(batch, "__len__") or not hasattr(batch, "__getitem__"):
                batch = list(batch)
            order.update(_batch_bytes(batch))
            if index < start or (offset + index) % W != w:
                continue
            part = self._slice(batch, index, C, c)
            self._yielded(index, order.hexdigest())
            yield part
        if expected is not None and index + 1 <= start:
            self._check_order(order.hexdigest(), expected, start)

    @staticmethod
    def _slice(batch, index: int, C: int, c: int):
        """CS-X ``c``'s slice of global batch ``index``."""
        n = len(batch)
        if n < C:
            raise ValueError(
                f"ShardedSampler: global batch {index} has {n} sample(s), fewer than "
                f"num_csx={C}, so some CS-X would get an empty slice of it. Every global "
                f"batch needs at least num_csx samples: use a batch_size of at least {C}, "
                f"and drop_last=True in the BatchSampler when the short last batch is the "
                f"cause."
            )
        if C == 1:
            return batch
        lo, hi = slice_bounds(n, C, c)
        part = batch[lo:hi]
        return list(part) if isinstance(part, tuple) else part

    def _iter_assigned(self, assignment) -> Iterator:
        """Dynamic assignment: yield the global batches whose numbers the worker's coordinator
        assigned (in increasing order; or one of the last :data:`PASSED_BATCHES` it walked
        past, which a dead worker owed), as long as they fall in this epoch.

        Number ``s`` is global batch ``s % n`` of epoch ``s // n`` (``n = len(data_source)``).
        The epoch's global batches are walked in order (the shuffle is drawn once, as in the
        round-robin path) and the ones assigned are yielded; the iteration ends where the
        next assigned number belongs to a later epoch. An epoch none of whose batches this
        worker was given yields nothing (``skipped_epoch`` is then True), after drawing its
        shuffle, so that the next epoch's is drawn as every other worker draws it."""
        info = get_worker_info()
        C, c = info.num_csx, info.wse_id
        n = len(self.data_source)
        start = self._resume_from or 0
        expected, self._resume_from, self._resume_digest = self._resume_digest, None, None
        self._start_iteration(start, expected)
        self.skipped_epoch = False
        check = None if expected is None else functools.partial(
            self._check_order, expected=expected, start=start)
        walk = _EpochWalk(self.data_source, n, start, check, self.epoch)
        while True:
            try:
                number = assignment.peek()
            except AssignmentClosed:
                return
            epoch, index = divmod(number, n)
            if epoch == self.epoch and index in walk.passed:
                batch, digest = walk.passed.pop(index)
                part = self._slice(batch, index, C, c)
                assignment.take()
                self._next, self._digest = index + 1, digest
                yield part
                continue
            if epoch > self.epoch:
                # walk the rest of the epoch as the round-robin path does: a sampler may draw
                # random numbers up to its end (RandomSampler draws again there), and the
                # next epoch's shuffle must be drawn from the same state in every worker
                self.skipped_epoch = walk.walked == 0
                walk.finish()
                return
            if epoch < self.epoch or index < max(walk.walked, start):
                raise RuntimeError(
                    f"ShardedSampler: global batch number {number} (batch {index} of epoch "
                    f"{epoch}) was assigned after this worker had passed it (epoch "
                    f"{self.epoch}, batch {max(walk.walked, start)}); numbers must reach a worker "
                    "in increasing order.")
            batch = walk.to(index)
            part = self._slice(batch, index, C, c)
            assignment.take()
            self._yielded(index, walk.digest())
            yield part

    def _yielded(self, index: int, digest: str) -> None:
        """Record that global batch ``index`` was yielded (drawn) with order digest ``digest``."""
        self._next = index + 1
        self._digest = digest
        if self._tracking:
            self._drawn.append((self._next, digest))

    def _start_iteration(self, start: int, expected: str | None) -> None:
        """A new iteration (an epoch, or a resumed one) starts at global batch ``start``: every
        batch drawn before was produced (a loader ends an epoch after yielding all it drew)."""
        self._next = start
        self._drawn.clear()
        self._produced_state = (start, expected if start else None)

    def track_production(self) -> None:
        """From now on ``state_dict()`` describes the position after the last batch the
        loader produced (reported with :meth:`batch_produced`), not after the last drawn."""
        self._tracking = True

    def batch_produced(self) -> None:
        """The loader yielded the batch of the oldest index batch drawn and not yet produced
        (loaders yield in the order they draw)."""
        if self._drawn:
            self._produced_state = self._drawn.popleft()

    def _check_order(self, digest: str, expected: str, start: int) -> None:
        if digest != expected:
            raise ValueError(
                f"ShardedSampler: the resumed position is global batch {start} of epoch "
                f"{self.epoch}, but the global batches before it are not the ones the saved run "
                "streamed, so the rest of the epoch would repeat some samples and skip others. "
                "The shuffle cannot be drawn again: give the sampler that shuffles its own "
                "seeded generator (RandomSampler(data, generator=torch.Generator()"
                ".manual_seed(seed)), or DistributedSampler(shuffle=True, seed=...)), and resume "
                "with the same input_fn and arguments."
            )

    def state_dict(self) -> dict:
        """``{"next_global_batch": n, "epoch": e, "order_digest": d}`` (see the class
        docstring)."""
        if self._resume_from is not None:
            state = {"next_global_batch": self._resume_from, "epoch": self.epoch}
            if self._resume_digest is not None:
                state["order_digest"] = self._resume_digest
            return state
        nxt, digest = self._produced_state if self._tracking else (self._next, self._digest)
        state = {"next_global_batch": nxt, "epoch": self.epoch}
        if digest is not None and nxt:
            state["order_digest"] = digest
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next iteration resume at global batch ``state_dict["next_global_batch"]``."""
        state = check_state("ShardedSampler", state_dict, ("next_global_batch", "epoch"))
        digest = state.get("order_digest")
        if digest is not None and not isinstance(digest, str):
            raise ValueError(
                f"ShardedSampler.load_state_dict: order_digest must be a str, got {digest!r}.")
        if state["epoch"] != self.epoch:
            self.set_epoch(state["epoch"])
        self._resume_from = self._next = state["next_global_batch"]
        self._resume_digest = digest
        self._drawn.clear()
        self._produced_state = (self._next, digest)

    def __repr__(self) -> str:
        return f"ShardedSampler({self.data_source!r})"


PASSED_BATCHES = 1024
"""Under dynamic assignment a worker can still produce this many of the latest global batches
it walked past (the numbers a dead worker owed, handed to it by its coordinator)."""


class _EpochWalk:
    """One epoch of a batch sampler walked in order under dynamic assignment: each global
    batch drawn is added to the order digest (checked at the resume position ``start`` by
    ``check_order``, if any), and the last :data:`PASSED_BATCHES` walked past are kept in ``passed``
    (index -> (batch, digest after it)): one handed to this worker later (its worker died) is
    yielded from there."""

    def __init__(self, data_source, n: int, start: int, check_order, epoch: int):
        self.source = iter(data_source)
        self.n, self.start, self.epoch = n, start, epoch
        self.check_order = check_order
        self.walked = 0  # global batches of this epoch walked (and digested)
        self.order = hashlib.blake2b(digest_size=16)
        self.passed: collections.OrderedDict[int, tuple] = collections.OrderedDict()

    def digest(self) -> str:
        return self.order.hexdigest()

    def to(self, index: int):
        """Walk up to global batch ``index`` of the epoch and return it."""
        batch = None
        while self.walked <= index:
            if self.walked == self.start and self.check_order is not None:
                self.check_order(self.digest())
            try:
                batch = next(self.source)
            except StopIteration:
                raise ValueError(
                    f"ShardedSampler: epoch {self.epoch} of the data source ended after "
                    f"{self.walked} global batches, but len(data_source) is {self.n}. Dynamic "
                    "assignment numbers global batches with len(data_source): give the "
                    "batch sampler a length that matches what it yields.") from None
            if not hasattr(batch, "__len__") or not hasattr(batch, "__getitem__"):
                batch = list(batch)
            self.order.update(_batch_bytes(batch))
            self.walked += 1
            if self.walked <= index:
                self.passed[self.walked - 1] = (batch, self.digest())
                if len(self.passed) > PASSED_BATCHES:
                    self.passed.popitem(last=False)
        return batch

    def finish(self) -> None:
        """Draw the rest of the epoch."""
        for _ in self.source:
            pass


# ---------------------------------------------------------------------------------------------
# DistributedSampler: samples interleaved over all workers
# ---------------------------------------------------------------------------------------------

GLOBAL_BATCH_ARGS = frozenset({"start_index", "shard", "batch_size", "num_samples", "pad_last"})
"""Arguments of the Release 2.x ``DistributedSampler`` (global batches): given any of them,
``DistributedSampler(...)`` is a :class:`GlobalBatchSampler`."""


class DistributedSampler:
    """A sampler that interleaves samples over every input worker of every CS-X.

    Given any of the Cerebras Release 2.x arguments (:data:`GLOBAL_BATCH_ARGS`: ``batch_size``,
    ``shard``, ...) it is a :class:`GlobalBatchSampler` instead, the sampler of global batches
    the Model Zoo's data processors use.

    Global worker ``g`` of ``T`` takes samples ``g, g + T, g + 2T, ...`` of the (optionally
    shuffled) order, exactly as ``torch.utils.data.DistributedSampler(dataset, num_replicas=T,
    rank=g, shuffle, seed, drop_last)`` does, including its padding (``drop_last=False`` repeats
    the first samples so every worker gets the same count) and its shuffle (a permutation seeded
    with ``seed + epoch``; call :meth:`set_epoch` each epoch). ``T`` and ``g`` are read from
    :func:`cstream.distributed.get_worker_info` when the sampler is iterated.

    ``state_dict()`` is ``{"epoch": e, "position": k, "num_replicas": T}``: this worker yielded
    ``k`` samples of epoch ``e``; ``load_state_dict`` makes the next iteration skip them.

    >>> from workers.context import WorkerInfo, worker_context
    >>> sampler = DistributedSampler(range(10))
    >>> with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=4)):
    ...     list(sampler)
    [1, 5, 9]
    """

    def __new__(cls, *args, **kwargs):
        if cls is DistributedSampler and (len(args) > 4 or GLOBAL_BATCH_ARGS & set(kwargs)):
            cls = GlobalBatchSampler
        return super().__new__(cls)

    def __init__(self, dataset, shuffle: bool = False, seed: int = 0, drop_last: bool = False):
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"DistributedSampler needs a dataset with len() (a map-style dataset), got "
                f"{type(dataset).__name__}. For an iterable dataset use "
                "cstream.utils.data.shard_iterable instead."
            )
        if not isinstance(shuffle, bool) or not isinstance(drop_last, bool):
            raise TypeError(
                f"DistributedSampler: shuffle and drop_last must be True or False, got "
                f"shuffle={shuffle!r}, drop_last={drop_last!r}."
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"DistributedSampler: seed must be an int, got {seed!r}.")
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._position = 0
        self._resume: dict | None = None

    @staticmethod
    def _sizes(n: int, T: int, drop_last: bool) -> tuple[int, int]:
        if drop_last and n % T:
            per = math.ceil((n - T) / T)
        else:
            per = math.ceil(n / T)
        return per, per * T

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` (the permutation seeded with ``seed + epoch``)."""
        self.epoch = check_int("epoch", epoch, 0, "DistributedSampler.set_epoch")

    def __len__(self) -> int:
        """The number of samples this worker yields in an epoch."""
        return self._sizes(len(self.dataset), get_worker_info().total_num_workers,
                           self.drop_last)[0]

    def _indices(self, T: int, g: int) -> list[int]:
        n = len(self.dataset)
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=gen).tolist()
        else:
            order = list(range(n))
        _, total = self._sizes(n, T, self.drop_last)
        if not self.drop_last:
            pad = total - n
            if pad and n:
                order += (order * math.ceil(pad / n))[:pad]
        else:
            order = order[:total]
        return order[g:total:T]

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        T, g = info.total_num_workers, info.global_worker_id
        start = 0
        if self._resume is not None:
            resume, self._resume = self._resume, None
            if resume["num_replicas"] != T:
                raise ValueError(
                    f"DistributedSampler: the state being resumed was saved with "
                    f"{resume['num_replicas']} workers in all (num_csx * num_workers_per_csx), "
                    f"but this run has {T}. Its position counts samples of one worker's "
                    "interleaved share, which differs with the worker count: resume with the "
                    "CSConfig the state was saved with."
                )
            start = resume["position"]
        indices = self._indices(T, g)
        self._position = start
        for i in indices[start:]:
            self._position += 1
            yield i

    def state_dict(self) -> dict:
        """``{"epoch": e, "position": k, "num_replicas": T}`` (see the class docstring)."""
        if self._resume is not None:
            return dict(self._resume)
        return {"epoch": self.epoch, "position": self._position,
                "num_replicas": get_worker_info().total_num_workers}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next iteration continue epoch ``state_dict["epoch"]`` after
        ``state_dict["position"]`` samples."""
        state = check_state("DistributedSampler", state_dict, ("epoch", "position", "num_replicas"))
        self.epoch = state["epoch"]
        self._position = state["position"]
        self._resume = {k: state[k] for k in ("epoch", "position", "num_replicas")}

    def __repr__(self) -> str:
        return (f"DistributedSampler(len={len(self.dataset)}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last})")


class GlobalBatchSampler(DistributedSampler):
    """``DistributedSampler`` given any of the Release 2.x arguments (``batch_size``,
    ``shard``, ``start_index``, ``num_samples``, ``pad_last``), as the Cerebras stack's:
    :class:`workers.global_batches.ShuffleSampler`, then
    :class:`~workers.global_batches.BatchSampler` when ``batch_size`` is given, then
    :class:`ShardedSampler` with ``shard`` (global batch ``i`` to input worker ``i % W`` of
    every CS-X, each CS-X its contiguous slice). Its defaults are the real package's:
    ``shuffle=True`` (with a ``seed``), ``drop_last=True``, ``shard=True``.

    ``set_state(start_index)`` continues after ``start_index`` samples streamed in all (what the
    Model Zoo's RestartableDataLoader calls on resume).

    >>> sampler = DistributedSampler(range(10), shuffle=False, batch_size=4)
    >>> list(sampler)
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> list(sampler)  # the 2 left over start the next epoch's first batch
    [[8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
    """

    def __init__(self, data_source, shuffle: bool = True, seed: int | None = None,
                 start_index: int = 0, shard: bool = True, batch_size: int | None = None,
                 drop_last: bool = True, num_samples: int | None = None,
                 pad_last: bool = False):
        if is_streamer() and not drop_last and not pad_last:
            raise ValueError(
                "DistributedSampler: on CSX every batch has the same size, and drop_last=False "
                "with pad_last=False may leave a smaller last batch. Set drop_last=True or "
                "pad_last=True.")
        if is_streamer() and batch_size is None and shard:
            raise ValueError(
                "DistributedSampler: on CSX a sharded sampler needs batch_size, the global "
                "batch size (each input worker takes its CS-X's slice of every global batch).")
        self.kwargs = dict(data_source=data_source, shuffle=shuffle, seed=seed, shard=shard,
                           batch_size=batch_size, drop_last=drop_last, num_samples=num_samples,
                           pad_last=pad_last)
        self.dataset, self.shuffle, self.seed, self.drop_last = data_source, shuffle, seed, \
            drop_last
        self.order = sampler = ShuffleSampler(data_source, num_samples=num_samples,
                                              shuffle=shuffle, seed=seed,
                                              start_index=start_index)
        if batch_size is not None:
            sampler = BatchSampler(sampler, batch_size, drop_last, pad_last)
            if shard:  # without a batch size there is one reader: the client (see above)
                sampler = ShardedSampler(sampler)
        self.sampler = sampler

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_state(self, start_index: int) -> None:
        """Continue after ``start_index`` samples streamed in all (by every worker).

        Sharded, the global batches keep their numbers: the order restarts at the epoch
        ``start_index`` falls in and the :class:`ShardedSampler` resumes at its global batch,
        so the input workers take up the numbering the executor continues (a restart at the
        sample itself would renumber the batches from 0)."""
        check_int("start_index", start_index, 0, "DistributedSampler.set_state")
        if not isinstance(self.sampler, ShardedSampler):
            self.__init__(**self.kwargs, start_index=start_index)
            return
        batch_size = self.kwargs["batch_size"]
        per_epoch = self.order.num_samples
        epoch, within = divmod(start_index, per_epoch)
        if per_epoch % batch_size or within % batch_size:
            raise ValueError(
                f"DistributedSampler.set_state({start_index}): the position is not at a global "
                f"batch of a whole number of batches per epoch ({per_epoch} samples an epoch, "
                f"batch_size={batch_size}), so the workers cannot take up the batches' "
                "numbering. Resume from a checkpoint of a run whose epoch is a multiple of the "
                "batch size (num_samples=..., or a dataset of such a length).")
        self.__init__(**self.kwargs, start_index=epoch * per_epoch)
        self.sampler.load_state_dict({"next_global_batch": within // batch_size, "epoch": epoch})

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s order (the shuffle seeded ``seed + epoch``); each pass also
        advances it by itself."""
        super().set_epoch(epoch)
        self.sampler.set_epoch(epoch)

    state_dict = load_state_dict = None  # it resumes by set_state (the loader's position)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k != "data_source")
        return f"DistributedSampler({shown})"


# ---------------------------------------------------------------------------------------------
# shard_iterable
# ---------------------------------------------------------------------------------------------

class _ShardedIterable:
    def __init__(self, iterable: Iterable):
        self.iterable = iterable

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        T, g = info.total_num_workers, info.global_worker_id
        for i, item in enumerate(self.iterable):
            if i % T == g:
                yield item

    def __len__(self) -> int:
        info = get_worker_info()
        return count_congruent(len(self.iterable), info.global_worker_id, info.total_num_workers)

    def __repr__(self) -> str:
        return f"shard_iterable({self.iterable!r})"


def shard_iterable(iterable: Iterable) -> Iterable:
    """Keep this worker's items of ``iterable``: item ``i`` goes to global worker ``i % T``.

    Global worker ``g`` of ``T`` (``T = num_csx * num_workers_per_csx``) gets items ``g, g + T,
    g + 2T, ...``; together the workers get every item exactly once. The worker is read when the
    result is iterated, and the result can be iterated again (once per epoch) if ``iterable`` can.
    Each worker still walks the whole of ``iterable`` and drops the other workers' items, so
    keep the items cheap to produce (paths, indices, records) and do the heavy work after sharding.

    >>> from workers.context import WorkerInfo, worker_context
    >>> with worker_context(WorkerInfo(local_worker_id=0, num_workers_per_csx=2, num_csx=2, wse_id=1)):
    ...     list(shard_iterable(range(10)))  # global worker 2 of 4
    [2, 6]
    """
    if not hasattr(iterable, "__iter__"):
        raise TypeError(
            f"shard_iterable expects an iterable, got {type(iterable).__name__}: {iterable!r}."
        )
    if isinstance(iterable, Iterator):
        raise TypeError(
            f"shard_iterable: {type(iterable).__name__} is a one-shot iterator, so the shard "
            "would be empty from the second epoch on. Pass a re-iterable object (a list, a "
            "range, a Dataset, or a class whose __iter__ starts over)."
        )
    return _ShardedIterable(iterable)
