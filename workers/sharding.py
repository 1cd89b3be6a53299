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
- :class:`ParquetDataset` splits the row groups of Parquet files over the ``T`` workers.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from workers.context import get_worker_info

__all__ = ["DistributedSampler", "ParquetDataset", "ShardedSampler", "shard_iterable"]


def _slice_bounds(n: int, parts: int, part: int) -> tuple[int, int]:
    """``[start, stop)`` of slice ``part`` when ``n`` items are cut into ``parts`` contiguous
    slices as equal as possible (the first ``n % parts`` one larger, like ``torch.tensor_split``)."""
    q, r = divmod(n, parts)
    start = part * q + min(part, r)
    return start, start + q + (1 if part < r else 0)


def _count_congruent(n: int, start: int, step: int) -> int:
    """How many of ``0..n-1`` are ``start, start + step, ...``."""
    return 0 if n <= start else (n - start + step - 1) // step


def _check_int(name: str, value: Any, minimum: int, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}.")
    return value


def _check_state(owner: str, state: Any, keys: Sequence[str]) -> dict:
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ValueError(
            f"{owner}.load_state_dict expects what {owner}.state_dict() returned (a dict with "
            f"keys {list(keys)}), got {state!r}."
        )
    for k in keys:
        _check_int(f"state_dict[{k!r}]", state[k], 0, f"{owner}.load_state_dict")
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

    ``state_dict()`` is ``{"next_global_batch": n, "epoch": e}``: ``n`` is the global batch index
    right after the last batch this worker yielded (global-batch units, so it does not depend on
    the number of workers). After ``load_state_dict``, the next iteration starts with this
    worker's first global batch at or after ``n``, for any ``W`` and ``C``.

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
        self._resume_from: int | None = None

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
        self.epoch = _check_int("epoch", epoch, 0, "ShardedSampler.set_epoch")
        target = self._epoch_target()
        if target is not None:
            target.set_epoch(epoch)

    def __len__(self) -> int:
        """The number of batches this worker yields in a full epoch."""
        info = get_worker_info()
        W = info.num_workers_per_csx
        n = len(self.data_source)
        first = (info.local_worker_id - self._offset(n, W)) % W
        return _count_congruent(n, first, W)

    def _offset(self, n, W: int) -> int:
        """Global batches numbered before this epoch (so the round-robin continues across
        epochs even when the epoch length is not a multiple of W)."""
        return 0 if n is None else (self.epoch * n) % W

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        W, C, w, c = info.num_workers_per_csx, info.num_csx, info.local_worker_id, info.wse_id
        start = self._resume_from or 0
        self._resume_from = None
        self._next = start
        try:
            offset = self._offset(len(self.data_source), W)
        except TypeError:
            offset = 0
        for index, batch in enumerate(self.data_source):
            if index < start or (offset + index) % W != w:
                continue
            if not hasattr(batch, "__len__") or not hasattr(batch, "__getitem__"):
                batch = list(batch)
            n = len(batch)
            if n < C:
                raise ValueError(
                    f"ShardedSampler: global batch {index} has {n} sample(s), fewer than "
                    f"num_csx={C}, so some CS-X would get an empty slice of it. Every global "
                    f"batch needs at least num_csx samples: use a batch_size of at least {C}, "
                    f"and drop_last=True in the BatchSampler when the short last batch is the "
                    f"cause."
                )
            self._next = index + 1
            if C == 1:
                yield batch
            else:
                lo, hi = _slice_bounds(n, C, c)
                part = batch[lo:hi]
                yield list(part) if isinstance(part, tuple) else part

    def state_dict(self) -> dict:
        """``{"next_global_batch": n, "epoch": e}`` (see the class docstring)."""
        return {"next_global_batch": self._next if self._resume_from is None else self._resume_from,
                "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next iteration resume at global batch ``state_dict["next_global_batch"]``."""
        state = _check_state("ShardedSampler", state_dict, ("next_global_batch", "epoch"))
        if state["epoch"] != self.epoch:
            self.set_epoch(state["epoch"])
        self._resume_from = self._next = state["next_global_batch"]

    def __repr__(self) -> str:
        return f"ShardedSampler({self.data_source!r})"


# ---------------------------------------------------------------------------------------------
# DistributedSampler: samples interleaved over all workers
# ---------------------------------------------------------------------------------------------

class DistributedSampler:
    """A sampler that interleaves samples over every input worker of every CS-X.

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
        self.epoch = _check_int("epoch", epoch, 0, "DistributedSampler.set_epoch")

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
        state = _check_state("DistributedSampler", state_dict, ("epoch", "position", "num_replicas"))
        self.epoch = state["epoch"]
        self._position = state["position"]
        self._resume = {k: state[k] for k in ("epoch", "position", "num_replicas")}

    def __repr__(self) -> str:
        return (f"DistributedSampler(len={len(self.dataset)}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last})")


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
        return _count_congruent(len(self.iterable), info.global_worker_id, info.total_num_workers)

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


# ---------------------------------------------------------------------------------------------
# ParquetDataset: row groups split over the workers
# ---------------------------------------------------------------------------------------------

def _expand_paths(paths) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        items = list(paths)
    except TypeError:
        raise TypeError(
            f"ParquetDataset: paths must be a path or a list of paths to Parquet files, got "
            f"{type(paths).__name__}: {paths!r}."
        ) from None
    if not items:
        raise ValueError("ParquetDataset: paths is empty; pass at least one Parquet file.")
    out = []
    for p in items:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"ParquetDataset: every path must be a str or os.PathLike, got {p!r}.")
        p = Path(p)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix == ".parquet" and q.is_file())
            if not found:
                raise ValueError(f"ParquetDataset: directory {str(p)!r} holds no *.parquet file.")
            out.extend(found)
        elif not p.exists():
            raise FileNotFoundError(f"ParquetDataset: Parquet file {str(p)!r} does not exist.")
        else:
            out.append(p)
    return out


def _is_numeric(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


class ParquetDataset(torch.utils.data.IterableDataset):
    """Batches of rows from Parquet files, with the row groups split over the input workers.

    The row groups of all files, in the order (file, row group), are dealt out round-robin: global
    worker ``g`` of ``T`` reads row groups ``g, g + T, ...``. Each worker yields dicts of column
    name -> tensor with ``batch_size`` rows (a batch may span row groups; the last one is shorter
    unless ``drop_last``). Columns must be numeric (integer, floating point or boolean).

    Inside a ``torch.utils.data.DataLoader`` with ``num_workers = n > 0`` (use ``batch_size=None``
    there), process ``i`` of the DataLoader reads every ``n``-th of the input worker's row groups,
    starting at its ``i``-th; ``state_dict`` then describes only in-process iteration.

    ``state_dict()`` is ``{"epoch": e, "row_group": r, "offset": k}``: the next row to read is row
    ``k`` of global row group ``r`` (``r`` = the number of row groups at the end of the epoch).

    Args:
        paths: a Parquet file, a directory of ``*.parquet`` files, or a list of either.
        columns: the columns to read (default: all columns of the first file).
        batch_size: rows per batch.
        drop_last: drop each worker's last, short batch of an epoch.

    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "d.parquet")
    >>> pq.write_table(pa.table({"x": list(range(6))}), path, row_group_size=2)
    >>> [b["x"].tolist() for b in ParquetDataset(path, batch_size=4)]
    [[0, 1, 2, 3], [4, 5]]
    """

    def __init__(self, paths, columns: Sequence[str] | None = None, batch_size: int = 1,
                 drop_last: bool = False):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.batch_size = _check_int("batch_size", batch_size, 1, "ParquetDataset")
        if not isinstance(drop_last, bool):
            raise TypeError(f"ParquetDataset: drop_last must be True or False, got {drop_last!r}.")
        self.drop_last = drop_last
        self.paths = _expand_paths(paths)
        if columns is not None:
            if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
                raise TypeError(
                    f"ParquetDataset: columns must be a list of column names, got {columns!r}."
                )
            columns = list(columns)
            if not columns:
                raise ValueError("ParquetDataset: columns is empty; name at least one column.")
        self.row_groups: list[tuple[int, int, int]] = []  # (file index, row group, rows)
        for fi, path in enumerate(self.paths):
            try:
                meta = pq.ParquetFile(path).metadata
                schema = pq.read_schema(path)
            except (pa.ArrowInvalid, OSError) as e:
                raise ValueError(
                    f"ParquetDataset: {str(path)!r} is not a readable Parquet file ({e})."
                ) from None
            names = list(schema.names)
            if columns is None:
                columns = names
            missing = [c for c in columns if c not in names]
            if missing:
                raise ValueError(
                    f"ParquetDataset: column(s) {missing} not in {str(path)!r}; its columns are "
                    f"{names}."
                )
            for c in columns:
                t = schema.field(c).type
                if not _is_numeric(t):
                    raise TypeError(
                        f"ParquetDataset: column {c!r} of {str(path)!r} has Arrow type {t}, which "
                        "is not numeric; only integer, floating point and boolean columns become "
                        "tensors. Leave it out with columns=[...] or convert it when writing."
                    )
            for rg in range(meta.num_row_groups):
                self.row_groups.append((fi, rg, meta.row_group(rg).num_rows))
        self.columns = columns
        self.epoch = 0
        self._pos = (0, 0)
        self._resume: tuple[int, int] | None = None
        self._files: dict[int, Any] = {}
        self._pickled_info = None

    # -- sharding --------------------------------------------------------------------------
    def _shard(self) -> tuple[list[int], int]:
        """This worker's global row-group indices and the number of input workers."""
        info = get_worker_info()
        tw = torch.utils.data.get_worker_info()
        if tw is not None and self._pickled_info is not None:
            # a torch DataLoader worker process started with "spawn": the worker context of the
            # process that started it came along in the pickled dataset
            info = self._pickled_info
        T, g = info.total_num_workers, info.global_worker_id
        mine = list(range(g, len(self.row_groups), T))
        if tw is not None and tw.num_workers > 1:
            mine = mine[tw.id::tw.num_workers]
        return mine, T

    def _rows_per_worker(self) -> int:
        mine, _ = self._shard()
        return sum(self.row_groups[r][2] for r in mine)

    def __len__(self) -> int:
        """The number of batches this worker yields in an epoch."""
        rows = self._rows_per_worker()
        return rows // self.batch_size if self.drop_last else -(-rows // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` (kept in the state; every epoch reads the row groups in one order)."""
        self.epoch = _check_int("epoch", epoch, 0, "ParquetDataset.set_epoch")

    # -- reading ---------------------------------------------------------------------------
    def _read(self, r: int) -> dict[str, torch.Tensor]:
        import pyarrow.parquet as pq

        fi, rg, _ = self.row_groups[r]
        f = self._files.get(fi)
        if f is None:
            f = self._files[fi] = pq.ParquetFile(self.paths[fi])
        table = f.read_row_group(rg, columns=self.columns)
        out = {}
        for name in self.columns:
            col = table.column(name)
            if col.null_count:
                raise ValueError(
                    f"ParquetDataset: column {name!r} has {col.null_count} null value(s) in row "
                    f"group {rg} of {str(self.paths[fi])!r}; tensors cannot hold nulls. Fill "
                    "them (e.g. pyarrow.compute.fill_null) before writing."
                )
            out[name] = torch.from_numpy(col.to_numpy().copy())
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        mine, T = self._shard()
        if len(self.row_groups) < T:
            warnings.warn(
                f"ParquetDataset: {len(self.row_groups)} row group(s) for {T} workers, so "
                f"{T - len(self.row_groups)} worker(s) get no data. Write the files with more, "
                "smaller row groups (pyarrow.parquet.write_table(..., row_group_size=...)) or "
                "use fewer input workers.",
                stacklevel=2,
            )
        end = len(self.row_groups)
        start_rg, offset = (mine[0] if mine else end), 0
        if self._resume is not None:
            (start_rg, offset), self._resume = self._resume, None
            if start_rg != end and start_rg not in mine:
                raise ValueError(
                    f"ParquetDataset: the state being resumed points at row group {start_rg}, "
                    f"which is not one of this worker's row groups ({mine[:8]}"
                    f"{'...' if len(mine) > 8 else ''}). Resume each worker with its own "
                    "state_dict() and the same number of workers."
                )
            if start_rg != end and not 0 <= offset < self.row_groups[start_rg][2]:
                raise ValueError(
                    f"ParquetDataset: the state being resumed has offset {offset} in row group "
                    f"{start_rg}, which has {self.row_groups[start_rg][2]} rows."
                )
        queue = [r for r in mine if r >= start_rg]
        self._pos = (start_rg, offset)
        pending: list[dict[str, torch.Tensor]] = []
        have = 0
        for qi, r in enumerate(queue):
            nxt = queue[qi + 1] if qi + 1 < len(queue) else end
            data = self._read(r)
            rows = self.row_groups[r][2]
            at = offset  # rows of r already taken into batches
            offset = 0
            while at < rows:
                take = min(self.batch_size - have, rows - at)
                pending.append({k: v[at:at + take] for k, v in data.items()})
                have += take
                at += take
                if have == self.batch_size:
                    self._pos = (r, at) if at < rows else (nxt, 0)
                    yield self._join(pending)
                    pending, have = [], 0
        if pending and not self.drop_last:
            self._pos = (end, 0)
            yield self._join(pending)
        self._pos = (end, 0)

    def _join(self, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if len(parts) == 1:
            return {k: v.clone() for k, v in parts[0].items()}
        return {k: torch.cat([p[k] for p in parts]) for k in self.columns}

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"epoch": e, "row_group": r, "offset": k}`` (see the class docstring)."""
        r, k = self._resume if self._resume is not None else self._pos
        return {"epoch": self.epoch, "row_group": r, "offset": k}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next iteration start at row ``offset`` of global row group ``row_group``."""
        state = _check_state("ParquetDataset", state_dict, ("epoch", "row_group", "offset"))
        if state["row_group"] > len(self.row_groups):
            raise ValueError(
                f"ParquetDataset.load_state_dict: row_group={state['row_group']} but the files "
                f"hold {len(self.row_groups)} row groups; the state is from other files."
            )
        self.epoch = state["epoch"]
        self._resume = (state["row_group"], state["offset"])

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_files"] = {}
        d["_pickled_info"] = get_worker_info()
        return d

    def __repr__(self) -> str:
        return (f"ParquetDataset({len(self.paths)} file(s), {len(self.row_groups)} row groups, "
                f"columns={self.columns}, batch_size={self.batch_size})")
