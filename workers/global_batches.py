"""The stages of the Cerebras stack's sampler of global batches for map-style datasets
(Release 2.x): ``DistributedSampler(data_source, shuffle, seed, start_index, shard, batch_size,
drop_last, num_samples, pad_last)`` (:class:`workers.sharding.GlobalBatchSampler`), which the
Model Zoo's data processors pass to a DataLoader as its ``batch_sampler``.

Three stages, each as the real package computes it:

1. :class:`ShuffleSampler`: one logical epoch of ``num_samples`` indices (the dataset's length by
   default; shorter or longer epochs wrap around the dataset), shuffled with a generator seeded
   ``seed + epoch``, starting at ``start_index``;
2. :class:`BatchSampler`: batches of the global ``batch_size``; with ``drop_last`` the samples
   left over at the end of an epoch start the next one's first batch, with ``pad_last`` the last
   batch is filled with :data:`PAD_INDEX`;
3. with ``shard``, :class:`workers.sharding.ShardedSampler`: global batch ``i`` goes to input
   worker ``i % W`` of every CS-X, each CS-X taking its contiguous slice, so the order does not
   depend on the number of systems or workers.

``set_state(start_index)`` restarts the order after ``start_index`` samples streamed in all (what
the Model Zoo's ``RestartableDataLoader`` calls on resume).
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable, Iterator, Optional

import torch

PAD_INDEX = object()
"""What fills the last batch's empty places with ``pad_last`` (``cstream.utils.data.sampler.
pad_index``): a map dataset that is given it returns a padding sample. It equals only itself."""


def _check_positive_int(name: str, value, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}.")
    return value


class ShuffleSampler:
    """One logical epoch of indices into ``data_source`` (see the module docstring)."""

    def __init__(self, data_source, num_samples: Optional[int] = None, shuffle: bool = True,
                 seed: Optional[int] = None, start_index: int = 0):
        self._data_source = data_source
        self._num_samples = num_samples
        _check_positive_int("num_samples", self.num_samples, "ShuffleSampler")
        self._frozen = self.num_samples
        if shuffle and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"ShuffleSampler: shuffling needs an int seed, got seed={seed!r}. "
                             "Pass seed=... (the Model Zoo's shuffle_seed).")
        self.shuffle, self.seed = shuffle, seed
        self.epoch = start_index // self.num_samples
        self.start_index = start_index - self.num_samples * self.epoch

    @property
    def num_samples(self) -> int:
        return len(self._data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        if self.num_samples != self._frozen:
            raise RuntimeError(
                f"ShuffleSampler: the dataset's length changed from {self._frozen} to "
                f"{self.num_samples} between epochs; a sampled dataset must keep its length.")
        n = len(self._data_source)
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed + self.epoch)
            if self.num_samples > n:  # the epoch repeats the dataset, in one shuffled order
                repeats = math.ceil(self.num_samples / n)
                order = torch.cat([torch.arange(n) for _ in range(repeats - 1)]
                                  + [torch.randperm(n, generator=gen)])[:self.num_samples]
                order = order[torch.randperm(self.num_samples, generator=gen)]
            else:
                order = torch.randperm(n, generator=gen)[:self.num_samples]
            yield from order[self.start_index:].tolist()
        else:
            yield from (i % n for i in range(self.start_index, self.num_samples))
        self.epoch += 1
        self.start_index = 0

    def __len__(self) -> int:
        return self.num_samples - self.start_index

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch`` next, from its start."""
        if epoch != self.epoch:
            self.epoch, self.start_index = epoch, 0


class BatchSampler:
    """Batches of ``batch_size`` indices; with ``drop_last`` the incomplete last batch of an
    epoch is carried into the next epoch's first batch, with ``pad_last`` (and not
    ``drop_last``) it is filled with :data:`PAD_INDEX`."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool, pad_last: bool):
        self.batch_size = _check_positive_int("batch_size", batch_size, "BatchSampler")
        if not isinstance(drop_last, bool) or not isinstance(pad_last, bool):
            raise ValueError(f"BatchSampler: drop_last and pad_last must be True or False, got "
                             f"drop_last={drop_last!r}, pad_last={pad_last!r}.")
        self.sampler, self.drop_last, self.pad_last = sampler, drop_last, pad_last
        self.leftover: list[int] = list(sampler) if len(sampler) < batch_size else []

    def __iter__(self) -> Iterator[list[int]]:
        if self.drop_last:
            samples = itertools.chain(self.leftover, self.sampler)
            while True:
                batch = list(itertools.islice(samples, self.batch_size))
                if len(batch) < self.batch_size:
                    self.leftover = batch
                    return
                yield batch
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch + [PAD_INDEX] * (self.batch_size - len(batch)) if self.pad_last else batch

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the sampler (a :class:`ShuffleSampler` draws that epoch's order)."""
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.drop_last:
            return (len(self.sampler) + len(self.leftover)) // self.batch_size
        return math.ceil(len(self.sampler) / self.batch_size)
