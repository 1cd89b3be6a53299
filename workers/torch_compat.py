"""torch's private names the input side uses, in one place, each checked by
``tests/test_foreign_names.py`` against the installed torch: a version that changes one fails
there, naming it. Other layers may add their own sections below."""

from __future__ import annotations

# -- workers: pytree helpers (torch has no public pytree module) ---------------------------------
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten  # noqa: F401

# -- workers: the single-process DataLoader iterator (workers.resume.lean_iter) ------------------
import torch  # noqa: E402

SINGLE_PROCESS_ITER_ATTRS = ("_next_index", "_dataset_fetcher", "_pin_memory", "_sampler_iter",
                             "_num_yielded", "_IterableDataset_len_called", "_pin_memory_device")
"""The fields of torch's ``_SingleProcessDataLoaderIter`` that :class:`LeanLoaderIter` reads."""


def single_process_iter(it) -> bool:
    """Whether ``it`` (``iter(a DataLoader)``) is torch's single-process iterator with every
    field :class:`LeanLoaderIter` reads."""
    return type(it) is torch.utils.data.dataloader._SingleProcessDataLoaderIter and all(
        hasattr(it, a) for a in SINGLE_PROCESS_ITER_ATTRS)


class LeanLoaderIter:
    """The steps of the single-process iterator's ``__next__`` without its per-batch profiler
    annotation while no profiler runs (entered fresh after each wait for data, that annotation
    costs ~0.15 ms a batch), keeping the sample indices of the last batch (:attr:`last_index`).
    torch's ``_SingleProcessDataLoaderIter._next_data`` is what it follows."""

    __slots__ = ("it", "last_index")

    def __init__(self, it):
        self.it = it
        self.last_index = None

    def __iter__(self):
        return self

    def __next__(self):
        it = self.it
        if it._sampler_iter is None or it._IterableDataset_len_called is not None \
                or torch.autograd._profiler_enabled():
            self.last_index = None
            return next(it)  # the loader's own path: reset, length warnings, profiling
        index = it._next_index()
        data = it._dataset_fetcher.fetch(index)
        if it._pin_memory:
            data = torch.utils.data._utils.pin_memory.pin_memory(data, it._pin_memory_device)
        it._num_yielded += 1
        self.last_index = index
        return data
