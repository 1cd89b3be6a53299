"""The input side of one CS-X without Ray: every worker's dataloader built in this process.

Same interface as :class:`workers.stream.CsxInputStream`; the in-process CSX mode and tests use it
to get exactly the worker sharding and round-robin order of the distributed input side.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch
from workers.torch_compat import tree_map_only

from workers.config import CSConfig
from workers.context import DataLoaderCheckpoint, WorkerInfo, worker_context
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.duplicates import WorkerKeys, sample_keys
from workers.errors import InputWorkerError, user_traceback
from workers.wire import batch_nbytes, content_digest, pack_batch
from workers.positions import RoundRobinOrder
from workers.resume import ResumeError, Source, check_position, start_position
from workers.stall import thread_stacks


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


def sample_key_batches(cs_config: CSConfig) -> int:
    """How many first batches of each worker carry sample keys for the duplicate check."""
    if cs_config.duplicate_samples == "ignore" or cs_config.total_num_workers < 2:
        return 0
    return cs_config.duplicate_check_batches


class _LocalWorker:
    def __init__(self, info: WorkerInfo, source: Source, consumed: int, keys_until: int):
        self.info = info
        self.source = source
        self.consumed = consumed  # batches handed out
        self.produced = consumed
        self.ahead: deque = deque()  # (batch, position, timing) drawn for the duplicate check
        self.position = source.position() if consumed else None
        self.keys_until = keys_until
        self.keys: list = []


class LocalInputStream:
    """One CS-X's workers, each a :class:`workers.resume.Source` in this process, read
    round-robin (step ``s`` from worker ``s % num_workers_per_csx``)."""

    def __init__(self, dataloader: DataLoader, cs_config: CSConfig, wse_id: int, *,
                 resume_states=None, **_transport_options):
        self.dataloader = dataloader
        self.cs_config = cs_config
        self.wse_id = wse_id
        W = cs_config.num_workers_per_csx
        self.num_workers = W
        saved = {st.local_worker_id: st for st in (resume_states or [])}
        self._workers: list[_LocalWorker] = []
        key_batches = sample_key_batches(cs_config)
        for w in range(W):
            info = WorkerInfo(w, W, cs_config.num_csx, wse_id)
            st = saved.get(w)
            pos = start_position() if st is None else check_position(
                dict(st.user_state_dict or start_position()),
                f"the resume state of CS-X {wse_id}, worker {w}")
            consumed = 0 if st is None else int(st.worker_step)
            with worker_context(info):
                try:
                    loader = dataloader.build(info)
                except Exception as e:
                    raise self._error(info, consumed, e, "while building its dataloader") from e
                source = Source(dataloader, loader, pos)
            wk = _LocalWorker(info, source, consumed, consumed + key_batches)
            wk.position = pos
            self._workers.append(wk)
        self._step = sum(wk.consumed for wk in self._workers)
        self._first_step = self._step  # global batch number of this run's first step
        self._peeked = None
        self._slowest_s: Optional[float] = None  # the slowest batch delivered
        self._producer: Optional[tuple] = None  # (thread, worker) that last ran input_fn

    def _error(self, info: WorkerInfo, batch: int, exc: BaseException, during: str):
        if isinstance(exc, (EmptyDataLoaderError, ResumeError)):
            return type(exc)(f"CS-X {self.wse_id}, input worker {info.local_worker_id}: {exc}")
        return InputWorkerError(self.wse_id, info.local_worker_id, type(exc).__name__, str(exc),
                                user_traceback(exc), during, self.num_workers, batch)

    def _produce(self, wk: _LocalWorker):
        self._producer = (threading.get_ident(), wk)
        t0, t0_cpu = time.time(), time.thread_time()
        with worker_context(wk.info):
            try:
                batch = next(wk.source)
            except Exception as e:
                raise self._error(wk.info, wk.produced, e, "while producing this batch") from e
            if wk.produced < wk.keys_until:
                key = sample_keys(batch, wk.source.epoch, wk.source.last_sample_ids())
                if key["ids"] is None:
                    key["digest"] = content_digest(pack_batch(batch)[0])
                wk.keys.append(key)
        wk.produced += 1
        return batch, wk.source.position(), (t0, time.time(), time.thread_time() - t0_cpu)

    def _pull(self):
        w = self._step % len(self._workers)
        wk = self._workers[w]
        item = wk.ahead.popleft() if wk.ahead else self._produce(wk)
        return w, item

    def peek_spec(self):
        if self._peeked is None:
            self._peeked = self._pull()
        return tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"),
                             self._peeked[1][0])

    def sample_keys(self) -> list[WorkerKeys]:
        """The sample keys of each worker's first batches (drawn ahead and kept for next())."""
        for wk in self._workers:
            while wk.produced < wk.keys_until:
                wk.ahead.append(self._produce(wk))
        return [WorkerKeys(self.wse_id, wk.info.local_worker_id, list(wk.keys))
                for wk in self._workers]

    def next(self):
        t0 = time.perf_counter()
        if self._peeked is not None:
            (w, (batch, position, produced)), self._peeked = self._peeked, None
        else:
            w, (batch, position, produced) = self._pull()
        wk = self._workers[w]
        info = BatchInfo(w, wk.consumed, time.perf_counter() - t0, batch_nbytes(batch),
                         produced_unix=produced[:2], received_unix=produced[1],
                         produce_cpu_s=produced[2])
        wk.consumed += 1
        wk.position = position
        self._step += 1
        cost = produced[1] - produced[0]
        if self._slowest_s is None or cost > self._slowest_s:
            self._slowest_s = cost
        return batch, info

    def slowest_batch_s(self) -> Optional[float]:
        """The longest a worker took to produce a batch this stream delivered (None: none)."""
        return self._slowest_s

    def stall_report(self) -> list[dict]:
        """The worker whose batch is being made (the one the next step, or the duplicate
        check, waits for), and the stack of the thread of this process that runs its
        ``input_fn`` (see :class:`workers.stall.InputStallError`)."""
        if self._producer is None:
            return []
        ident, wk = self._producer
        w = wk.info.local_worker_id
        number = RoundRobinOrder(self.num_workers).global_batch(w, wk.produced)
        return [{"wse_id": self.wse_id, "local_worker_id": w, "pid": os.getpid(),
                 "batches": [(number, number - self._first_step + 1)],
                 "threads": thread_stacks(idents={ident}), "note": ""}]

    def worker_states(self):
        return [
            DataLoaderCheckpoint(
                local_worker_id=wk.info.local_worker_id,
                num_workers_per_csx=wk.info.num_workers_per_csx, num_csx=wk.info.num_csx,
                wse_id=wk.info.wse_id, appliance_step=self._step, worker_step=wk.consumed,
                user_state_dict=dict(wk.position),
            )
            for wk in self._workers
        ]

    def stats(self):
        return {"workers": [{"local_worker_id": wk.info.local_worker_id, "batches": wk.consumed}
                            for wk in self._workers],
                "assignment": {"requested": self.cs_config.input_assignment, "mode": "static",
                               "reason": "the in-process input side produces every batch in "
                                         "step order in one thread (round-robin)"}}

    def can_change_workers(self) -> tuple[bool, str]:
        """An in-process stream cannot change its workers (see
        :meth:`workers.stream.CsxInputStream.can_change_workers` for one that can)."""
        return False, ("the stream runs its workers in this process, one after another "
                       "(in_process=True): run the input workers on Ray to change them")

    def active_workers(self) -> list[int]:
        """The local ids of the workers taking part: all of them."""
        return list(range(self.num_workers))

    def ready_count(self) -> int:
        return 0

    def close(self):
        for wk in self._workers:
            try:
                wk.source.close()
            except ValueError:  # a generator still running in a thread stuck in input_fn
                pass
        self._workers = []
