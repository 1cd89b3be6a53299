"""Global batches of the rows of Parquet files, dealt out to the input workers as
:class:`workers.sharding.ShardedSampler` deals its batches."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from workers.context import AssignmentClosed, get_batch_assignment, get_worker_info
from workers.sharding import check_int, check_state, count_congruent, slice_bounds

__all__ = ["ParquetDataset"]



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


_PARQUET_STATE_KEYS = ("epoch", "next_global_batch", "batch_size", "num_rows")


class ParquetDataset(torch.utils.data.IterableDataset):
    """Batches of rows from Parquet files, dealt out to the input workers as global batches.

    The rows of all files, in the order (file, row group, row), make the global batches of an
    epoch: global batch ``b`` is rows ``[b * batch_size, (b + 1) * batch_size)``, the last one
    shorter (``drop_last=False``) or left out (``drop_last=True``) -- what one process reading
    the files yields. They are dealt out as :class:`ShardedSampler` deals its global batches:
    under round-robin (static) assignment worker ``w`` of every CS-X takes global batches ``w,
    w + W, w + 2W, ...`` (numbered across epochs), under dynamic assignment the ones whose
    numbers the coordinator gives it, and CS-X ``c`` takes its contiguous slice of each (the
    slices of one batch differ by at most one row). So at any ``num_csx`` x
    ``num_workers_per_csx`` the wafer sees the single-process sequence of batches, and one
    epoch's worth of steps streams every row exactly once. Where a batch cannot be sliced over
    the CS-Xs (fewer rows than ``num_csx``), iterating raises with the numbers. Each worker
    yields dicts of column name -> tensor. Columns must be numeric (integer, floating point or
    boolean).

    A worker reads only the row groups its batches touch (``ParquetFile.read_row_group``) and
    keeps the last one read for the next batch. A row group much longer than ``batch_size x
    num_workers_per_csx`` is read by every worker of a CS-X: write smaller row groups where
    reading is the bottleneck.

    Inside a ``torch.utils.data.DataLoader`` with ``num_workers = m > 0`` (use
    ``batch_size=None`` there), process ``i`` of the DataLoader makes the input worker's
    batches ``i, i + m, ...`` and the DataLoader's in-order reading gives back the input
    worker's sequence. Such a loader takes no part in dynamic assignment (its processes
    cannot be given batch numbers): the run keeps round-robin and says why.

    ``state_dict()`` is ``{"epoch": e, "next_global_batch": n, "batch_size": B, "num_rows":
    R}``: ``n`` is the global batch right after the last one this worker yielded (global-batch
    units, so it does not depend on the number of workers); ``B`` and ``R`` identify the
    batches, so that a state of other files or another batch size is refused. After
    ``load_state_dict`` the next iteration starts with this worker's first global batch at or
    after ``n``, for any ``W`` and ``C``.

    Args:
        paths: a Parquet file, a directory of ``*.parquet`` files, or a list of either.
        columns: the columns to read (default: all columns of the first file).
        batch_size: rows per global batch.
        drop_last: leave out the last global batch of an epoch when it is short.

    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> from workers.context import WorkerInfo, worker_context
    >>> path = os.path.join(tempfile.mkdtemp(), "d.parquet")
    >>> pq.write_table(pa.table({"x": list(range(10))}), path, row_group_size=3)
    >>> [b["x"].tolist() for b in ParquetDataset(path, batch_size=4)]  # worker 0 of 1
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> with worker_context(WorkerInfo(local_worker_id=1, num_workers_per_csx=2)):
    ...     [b["x"].tolist() for b in ParquetDataset(path, batch_size=4)]  # global batch 1
    [[4, 5, 6, 7]]
    """

    def __init__(self, paths, columns: Sequence[str] | None = None, batch_size: int = 1,
                 drop_last: bool = False):
        self.batch_size = check_int("batch_size", batch_size, 1, "ParquetDataset")
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
            columns = self._add_file(fi, path, columns)
        self.columns = columns
        self._starts = [0]  # global row index where each row group starts
        for _, _, rows in self.row_groups:
            self._starts.append(self._starts[-1] + rows)
        self.epoch = 0
        self._next = 0  # the global batch after the last one yielded
        self._resume_from: int | None = None
        self.skipped_epoch = False  # the last epoch gave this worker no batch (on purpose)
        self._files: dict[int, Any] = {}
        self._cached: tuple[int, dict] | None = None  # (row group, its columns as tensors)
        self._pickled_info = None

    def _add_file(self, fi: int, path: Path, columns: list[str] | None) -> list[str]:
        """Check one file's columns and record its row groups; returns the columns to read."""
        import pyarrow as pa
        import pyarrow.parquet as pq

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
        return columns

    @property
    def num_rows(self) -> int:
        return self._starts[-1]

    @property
    def num_global_batches(self) -> int:
        """Global batches in an epoch (what one process reading the files yields)."""
        full, short = divmod(self.num_rows, self.batch_size)
        return full + (1 if short and not self.drop_last else 0)

    # -- dealing out -----------------------------------------------------------------------
    def _identity(self):
        """``(cstream worker info, torch DataLoader worker info or None)``."""
        info = get_worker_info()
        tw = torch.utils.data.get_worker_info()
        if tw is not None and self._pickled_info is not None:
            # a torch DataLoader worker process started with "spawn": the worker context of the
            # process that started it came along in the pickled dataset
            info = self._pickled_info
        return info, tw

    def _check_layout(self, C: int) -> None:
        """Refuse, with the numbers, global batches that cannot be sliced over ``C`` CS-Xs."""
        B, R = self.batch_size, self.num_rows
        if C > 1 and B < C:
            raise ValueError(
                f"ParquetDataset: batch_size={B} is smaller than num_csx={C}; every global "
                f"batch is sliced over the CS-Xs, so some CS-X would get no row of it. Use a "
                f"batch_size of at least {C}.")
        short = R % B
        if C > 1 and 0 < short < C and not self.drop_last:
            raise ValueError(
                f"ParquetDataset: the last global batch of an epoch has {short} row(s) ({R} "
                f"rows = {R // B} x batch_size {B} + {short}), fewer than num_csx={C}, so some "
                f"CS-X would get no row of it. Use drop_last=True (it leaves those {short} "
                "row(s) out, as one process reading the files with drop_last=True does), or a "
                f"batch_size that leaves at least {C} rows in the last batch.")

    def __len__(self) -> int:
        """The number of batches this worker yields in an epoch under round-robin assignment
        (worker 0 of 1: the global batches of an epoch)."""
        info, tw = self._identity()
        n, W = self.num_global_batches, info.num_workers_per_csx
        count = count_congruent(n, (info.local_worker_id - self.epoch * n) % W, W)
        if tw is not None and tw.num_workers > 1:
            count = count_congruent(count, tw.id, tw.num_workers)
        return count

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` (every epoch reads the rows in one order; the epoch places its
        global batches in the numbering across epochs). Another epoch than the current one
        starts at its first global batch."""
        epoch = check_int("epoch", epoch, 0, "ParquetDataset.set_epoch")
        if epoch != self.epoch:
            self._next, self._resume_from = 0, None
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info, tw = self._identity()
        self._check_layout(info.num_csx)
        start, self._resume_from = self._resume_from or 0, None
        self._next = start
        self.skipped_epoch = False
        assignment = get_batch_assignment() if tw is None else None
        if assignment is not None:
            return self._iter_assigned(assignment, info)
        return self._iter_round_robin(info, tw, start)

    def _iter_round_robin(self, info, tw, start: int) -> Iterator[dict[str, torch.Tensor]]:
        n, W = self.num_global_batches, info.num_workers_per_csx
        offset = (self.epoch * n) % W  # global batches numbered before this epoch
        mine = range(start + (info.local_worker_id - offset - start) % W, n, W)
        if tw is not None and tw.num_workers > 1:
            mine = mine[tw.id::tw.num_workers]
        for b in mine:
            batch = self._global_batch(b, info)
            self._next = b + 1
            yield batch
        self.skipped_epoch = n > 0 and not mine

    def _iter_assigned(self, assignment, info) -> Iterator[dict[str, torch.Tensor]]:
        """Dynamic assignment: the global batches whose numbers the worker's coordinator
        assigned, as long as they fall in this epoch (number ``s`` is global batch ``s % n``
        of epoch ``s // n``), as :meth:`ShardedSampler._iter_assigned` does."""
        n = self.num_global_batches
        yielded = False
        while n:
            try:
                number = assignment.peek()
            except AssignmentClosed:
                return
            epoch, b = divmod(number, n)
            if epoch > self.epoch:
                self.skipped_epoch = not yielded
                return
            if epoch < self.epoch:
                raise RuntimeError(
                    f"ParquetDataset: global batch number {number} (batch {b} of epoch {epoch})"
                    f" was assigned after this worker had passed its epoch (epoch {self.epoch});"
                    " numbers of an earlier epoch cannot be read again.")
            # a batch this worker passed (a lost worker's number) is read again; the position
            # stays after the furthest batch made
            batch = self._global_batch(b, info)
            assignment.take()
            self._next = max(self._next, b + 1)
            yielded = True
            yield batch

    # -- reading ---------------------------------------------------------------------------
    def _global_batch(self, b: int, info) -> dict[str, torch.Tensor]:
        """This CS-X's slice of global batch ``b``."""
        lo = b * self.batch_size
        hi = min(lo + self.batch_size, self.num_rows)
        if info.num_csx > 1:
            a, z = slice_bounds(hi - lo, info.num_csx, info.wse_id)
            lo, hi = lo + a, lo + z
        parts = []
        row = lo
        while row < hi:
            r = bisect.bisect_right(self._starts, row) - 1
            data = self._row_group(r)
            k0, k1 = row - self._starts[r], min(hi, self._starts[r + 1]) - self._starts[r]
            parts.append({c: v[k0:k1] for c, v in data.items()})
            row = self._starts[r] + k1
        if len(parts) == 1:  # a copy: the batch does not keep the whole row group alive
            return {k: v.clone() for k, v in parts[0].items()}
        return {k: torch.cat([p[k] for p in parts]) for k in self.columns}

    def _row_group(self, r: int) -> dict[str, torch.Tensor]:
        """Global row group ``r`` as tensors (the last one read is kept)."""
        import pyarrow.parquet as pq

        if self._cached is not None and self._cached[0] == r:
            return self._cached[1]
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
        self._cached = (r, out)
        return out

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"epoch": e, "next_global_batch": n, "batch_size": B, "num_rows": R}`` (see the
        class docstring)."""
        n = self._resume_from if self._resume_from is not None else self._next
        return {"epoch": self.epoch, "next_global_batch": n, "batch_size": self.batch_size,
                "num_rows": self.num_rows}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next iteration start at global batch ``state_dict["next_global_batch"]``
        of epoch ``state_dict["epoch"]``."""
        state = check_state("ParquetDataset", state_dict, _PARQUET_STATE_KEYS)
        if (state["batch_size"], state["num_rows"]) != (self.batch_size, self.num_rows):
            raise ValueError(
                f"ParquetDataset.load_state_dict: the state was saved reading "
                f"{state['num_rows']} rows in global batches of {state['batch_size']}, and this "
                f"dataset has {self.num_rows} rows in batches of {self.batch_size}; its position "
                "counts the saved run's global batches, which hold other rows here. Resume with "
                "the same files and batch_size.")
        n = self.num_global_batches
        if state["next_global_batch"] > n:
            raise ValueError(
                f"ParquetDataset.load_state_dict: next_global_batch="
                f"{state['next_global_batch']}, but an epoch has {n} global batches.")
        self.epoch = state["epoch"]
        self._resume_from = self._next = state["next_global_batch"]

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_files"] = {}
        d["_cached"] = None
        d["_pickled_info"] = get_worker_info()
        return d

    def __repr__(self) -> str:
        return (f"ParquetDataset({len(self.paths)} file(s), {len(self.row_groups)} row groups, "
                f"columns={self.columns}, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last})")
