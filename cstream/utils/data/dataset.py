"""``SyntheticDataset``: samples made from a spec, for compile checks and benchmarks.

>>> import torch
>>> ds = SyntheticDataset({"x": torch.zeros(2), "i": lambda i: torch.tensor(i)}, num_samples=3)
>>> [int(s["i"]) for s in ds], len(ds)
([0, 1, 2], 3)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from workers.torch_compat import tree_flatten, tree_unflatten


class SyntheticDataset(torch.utils.data.IterableDataset):
    """Yields ``sample_spec`` with each tensor leaf cloned and each callable leaf called with
    the sample's index; ``num_samples`` samples (None: without end)."""

    def __init__(self, sample_spec, num_samples: Optional[int] = None):
        super().__init__()
        self._leaves, self._spec = tree_flatten(sample_spec)
        if not self._leaves:
            raise ValueError("`sample_spec` must be a non-empty python tree of `torch.Tensor` "
                             "or `Callable`.")
        for leaf in self._leaves:
            if not isinstance(leaf, (torch.Tensor, Callable)):
                raise ValueError(f"`sample_spec` is expected to contain a python tree of "
                                 f"`torch.Tensor`, or `Callable`, but got an item of type "
                                 f"`{type(leaf)}`.")
        if num_samples is not None and (isinstance(num_samples, bool)
                                        or not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(f"`num_samples` must be a positive integer or None, got "
                             f"{num_samples!r}.")
        self._num_samples = num_samples

    def __iter__(self):
        index = 0
        while self._num_samples is None or index < self._num_samples:
            flat = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf(index)
                    for leaf in self._leaves]
            yield tree_unflatten(flat, self._spec)
            index += 1

    def __len__(self) -> int:
        if self._num_samples is None:
            raise TypeError("`SyntheticDataset` does not have a length because `num_samples` "
                            "was not provided.")
        return self._num_samples
