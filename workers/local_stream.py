"""The input side of one CS-X without Ray: every worker's dataloader built in this process.

Same interface as :class:`workers.stream.CsxInputStream`; the in-process CSX mode and tests use it
to get exactly the worker sharding and round-robin order of the distributed input side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint, WorkerInfo, worker_context
from workers.dataloader import DataLoader, iterate_cycled


@dataclass
class BatchInfo:
    local_worker_id: int
    worker_step: int
    wait_s: float
    nbytes: int
    produced_unix: Optional[tuple] = None
    """(start, end) of the batch's production in its worker, ``time.time()`` seconds."""
    received_unix: Optional[float] = None
    """When the batch reached the consumer's side of the transport, ``time.time()`` seconds."""
    produce_cpu_s: Optional[float] = None
    """CPU time the producing thread spent on the batch."""


def batch_nbytes(batch) -> int:
    leaves, _ = tree_flatten(batch)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class LocalInputStream:
    def __init__(self, dataloader: DataLoader, cs_config: CSConfig, wse_id: int, *,
                 resume_states=None, **_ignored):
        self.cs_config = cs_config
        self.wse_id = wse_id
        W = cs_config.num_workers_per_csx
        self.infos = [WorkerInfo(w, W, cs_config.num_csx, wse_id) for w in range(W)]
        self._iters = []
        self._consumed = [0] * W
        skip = [0] * W
        if resume_states:
            for st in resume_states:
                skip[st.local_worker_id] = int(st.user_state_dict.get("consumed", 0))
        for info in self.infos:
            with worker_context(info):
                loader = dataloader.build(info)
            it = iterate_cycled(dataloader, loader)
            for _ in range(skip[info.local_worker_id]):
                next(it)
            self._consumed[info.local_worker_id] = skip[info.local_worker_id]
            self._iters.append(it)
        self._step = 0
        self._peeked = None

    def _pull(self):
        w = self._step % len(self._iters)
        t0, t0_cpu = time.time(), time.thread_time()
        with worker_context(self.infos[w]):
            batch = next(self._iters[w])
        return w, batch, (t0, time.time(), time.thread_time() - t0_cpu)

    def peek_spec(self):
        if self._peeked is None:
            self._peeked = self._pull()
        return tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"),
                             self._peeked[1])

    def next(self):
        t0 = time.perf_counter()
        if self._peeked is not None:
            (w, batch, produced), self._peeked = self._peeked, None
        else:
            w, batch, produced = self._pull()
        info = BatchInfo(w, self._consumed[w], time.perf_counter() - t0, batch_nbytes(batch),
                         produced_unix=produced[:2], received_unix=produced[1],
                         produce_cpu_s=produced[2])
        self._consumed[w] += 1
        self._step += 1
        return batch, info

    def worker_states(self):
        return [
            DataLoaderCheckpoint(
                local_worker_id=i.local_worker_id, num_workers_per_csx=i.num_workers_per_csx,
                num_csx=i.num_csx, wse_id=i.wse_id, worker_step=self._consumed[i.local_worker_id],
                user_state_dict={"consumed": self._consumed[i.local_worker_id]},
            )
            for i in self.infos
        ]

    def stats(self):
        return {"workers": [{"local_worker_id": i, "batches": c}
                            for i, c in enumerate(self._consumed)]}

    def ready_count(self) -> int:
        return 0

    def close(self):
        for it in self._iters:
            it.close()
        self._iters = []
