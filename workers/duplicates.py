"""Are the input workers streaming the same samples? One check across every worker of every CS-X.

Each worker's first few batches of a run are described by *sample keys*: the sample ids its
sampler gave (a torch ``DataLoader`` over a map-style dataset, with or without a batch sampler),
or, where no sampler names the samples (iterable datasets, lists of tensors, loaders with their
own worker processes), a digest of each batch's content. Keys carry the epoch they were drawn
in, so a round-robin that carries on into the next epoch is not mistaken for a duplicate.

Workers that share a key are grouped (a worker that shares samples with a worker that shares
samples with a third is in their group); the largest group is how many times each of its
samples is streamed. An ``input_fn`` that ignores its worker context makes every worker stream
every sample: one group of all ``num_csx * num_workers_per_csx`` workers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch
from workers.torch_compat import tree_flatten

from workers.errors import UnshardedInputError

_ROW_BYTES = 4096


def row_digests(batch, n: int) -> list[str] | None:
    """A digest of each of the ``n`` samples (rows along the leading dimension) of a batch:
    every tensor leaf's row, whole up to 4 KiB and its first and last 2 KiB beyond. None when
    a tensor leaf does not have ``n`` rows."""
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)]
    if not leaves or any(t.dim() == 0 or t.shape[0] != n for t in leaves):
        return None
    hashes = [hashlib.blake2b(digest_size=8) for _ in range(n)]
    for t in leaves:
        t = t.detach()
        if t.device.type != "cpu" or t.layout != torch.strided:
            return None
        rows = t.contiguous().reshape(n, -1).view(torch.uint8).numpy() if t.numel() else \
            np.zeros((n, 0), np.uint8)
        width = rows.shape[1]
        if width > _ROW_BYTES:
            rows = np.concatenate([rows[:, :_ROW_BYTES // 2], rows[:, -_ROW_BYTES // 2:]], axis=1)
        rows = np.ascontiguousarray(rows)
        for h, row in zip(hashes, rows):
            h.update(row.tobytes())
            h.update(str(width).encode())
    return [h.hexdigest() for h in hashes]


def sample_keys(batch, epoch: int, ids: list[int] | None) -> dict:
    """The sample keys of one batch: its sample ids with a digest of each sample's content
    (two workers that number their own shards 0, 1, ... are not mistaken for each other), or
    only the epoch when the sampler gave no ids (:func:`workers.wire.content_digest` of the packed batch is
    added when it is sent)."""
    rows = row_digests(batch, len(ids)) if ids is not None else None
    if rows is None:
        return {"epoch": epoch, "ids": None}
    return {"epoch": epoch, "ids": ids, "rows": rows}


@dataclass
class WorkerKeys:
    """The sample keys of one worker's first batches."""

    wse_id: int
    local_worker_id: int
    batches: list = field(default_factory=list)  # per batch: {"epoch", "ids" or "digest"}

    @property
    def name(self) -> str:
        return f"CS-X {self.wse_id} worker {self.local_worker_id}"


@dataclass
class DuplicateReport:
    """What :func:`find_duplicates` found."""

    times: int
    """How many workers stream the same samples (the largest group of overlapping workers)."""
    workers: list
    """``(wse_id, local_worker_id)`` of that group."""
    shared_keys: int
    """Sample ids (or batches, by content) streamed by more than one worker."""
    compared_keys: int
    by: str
    """``"sample ids"`` or ``"content"``."""
    batches_per_worker: int
    message: str = ""

    def to_dict(self) -> dict:
        return {"times": self.times, "workers": [list(w) for w in self.workers],
                "shared_keys": self.shared_keys, "compared_keys": self.compared_keys,
                "by": self.by, "batches_per_worker": self.batches_per_worker,
                "message": self.message}


def _groups(members: dict) -> list[set]:
    """Union of workers that share a key: ``members`` maps key -> set of worker indices."""
    parent: dict[int, int] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for ws in members.values():
        ws = list(ws)
        for w in ws[1:]:
            parent[find(w)] = find(ws[0])
    out: dict[int, set] = {}
    for x in parent:
        out.setdefault(find(x), set()).add(x)
    return list(out.values())


def find_duplicates(keys: list[WorkerKeys], input_fn_name: str) -> DuplicateReport | None:
    """Compare the workers' sample keys; None when no two workers streamed the same sample."""
    if len(keys) < 2:
        return None
    by_ids = all(b.get("ids") is not None for k in keys for b in k.batches)
    members: dict = {}
    for i, k in enumerate(keys):
        for b in k.batches:
            if by_ids:
                for sid, row in zip(b["ids"], b["rows"]):
                    members.setdefault((b["epoch"], sid, row), set()).add(i)
            elif b.get("digest") is not None:
                members.setdefault((b["epoch"], b["digest"]), set()).add(i)
    shared = {key: ws for key, ws in members.items() if len(ws) > 1}
    if not shared:
        return None
    group = sorted(max(_groups(shared), key=len))
    workers = [(keys[i].wse_id, keys[i].local_worker_id) for i in group]
    per_worker = max(len(k.batches) for k in keys)
    by = "sample ids" if by_ids else "content"
    what = "sample ids" if by_ids else "batches (compared by content)"
    names = ", ".join(keys[i].name for i in group[:8]) + (", ..." if len(group) > 8 else "")
    report = DuplicateReport(times=len(group), workers=workers, shared_keys=len(shared),
                             compared_keys=len(members), by=by, batches_per_worker=per_worker)
    report.message = (
        f"input_fn {input_fn_name} streams the same samples on {len(group)} input workers "
        f"({names}): {len(shared)} of the {len(members)} {what} in their first {per_worker} "
        f"batch(es) were streamed by more than one worker, so each of those samples is streamed "
        f"{len(group)} times as often as intended. Every input worker calls input_fn; give each "
        "its own shard with cstream.utils.data.ShardedSampler (global batches), "
        "DistributedSampler, shard_iterable or ParquetDataset, or split the data yourself with "
        "cstream.distributed.get_worker_info() (wse_id, local_worker_id, num_csx, "
        "num_workers_per_csx). CSConfig(duplicate_samples='error') makes this an error; "
        "'ignore' skips the check."
    )
    return report


def check_streams(streams: list, input_fn_name: str, mode: str) -> DuplicateReport | None:
    """Compare the first batches of every worker of every CS-X's stream (``mode`` is
    ``CSConfig.duplicate_samples``). Returns the report (None: no duplicates, or ``"ignore"``);
    with ``"error"`` raises :class:`~workers.errors.UnshardedInputError` instead."""
    if mode == "ignore":
        return None
    keys = [k for s in streams for k in s.sample_keys()]
    report = find_duplicates(keys, input_fn_name)
    if report is not None and mode == "error":
        raise UnshardedInputError(report.message, report.times)
    return report
