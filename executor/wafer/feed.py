"""The wafer's input feed: one input stream per CS-X, each drained in step order by a feeder
thread into a bounded buffer, so the wafer takes ready batches without paying the transport on
its own time. A step's input is complete when every CS-X's buffer has delivered its part."""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from workers.config import CSConfig
from workers.flow import FlowPolicy
from workers.stall import InputStallError, stall_bound
from workers.torch_compat import tree_flatten, tree_unflatten


class BatchSpecError(ValueError):
    """A batch does not match the spec the step was traced with."""


class _Failure:
    def __init__(self, exc: BaseException, tb: str):
        self.exc, self.tb = exc, tb


@dataclass
class StepInput:
    """One step's batch: the CS-Xs' parts joined, what each part's worker reported, and (on
    checkpoint steps) the input position after it."""
    batch: Any
    infos: list
    worker_states: Optional[list]

    @property
    def tensors(self) -> list:
        """The batch's tensor leaves, in order: what the step's graph takes."""
        if isinstance(self.batch, torch.Tensor):
            return [self.batch]
        if isinstance(self.batch, (tuple, list)) and all(
                isinstance(t, torch.Tensor) for t in self.batch):
            return list(self.batch)  # the common (inputs, targets): no pytree walk
        return [t for t in tree_flatten(self.batch)[0] if isinstance(t, torch.Tensor)]


def check_leaves(leaves, where: str) -> None:
    tensors = 0
    for i, leaf in enumerate(leaves):
        if leaf is None:
            continue
        if not isinstance(leaf, torch.Tensor):
            raise BatchSpecError(
                f"{where}: leaf {i} of the batch is a {type(leaf).__name__} ({leaf!r:.60}), not a "
                "tensor. Batches must be (nested) tensors; convert other values in input_fn or "
                "the dataset's collate_fn.")
        tensors += 1
        if leaf.dim() > 0 and leaf.shape[0] == 0:
            raise BatchSpecError(
                f"{where}: leaf {i} of the batch is empty (shape {tuple(leaf.shape)}). Check "
                "batch_size and the data set's length.")
    if tensors == 0:
        raise BatchSpecError(f"{where}: the batch holds no tensor.")


def concat_parts(parts: list):
    """Join the per-CS-X sub-batches along the batch dimension (data parallel)."""
    if len(parts) == 1:
        return parts[0]
    flats = [tree_flatten(p) for p in parts]
    spec = flats[0][1]
    for i, (_, s) in enumerate(flats[1:], 1):
        if s != spec:
            raise BatchSpecError(
                f"CS-X {i} received a batch whose structure differs from CS-X 0's ({s} vs {spec})."
            )
    leaves = []
    for column in zip(*(f[0] for f in flats)):
        if isinstance(column[0], torch.Tensor):
            leaves.append(torch.cat(column, dim=0))
        else:
            leaves.append(column[0])
    return tree_unflatten(leaves, spec)


class Stream(Protocol):
    """What the feed uses of one CS-X's input stream (``workers.stream.CsxInputStream`` on Ray,
    ``workers.local_stream.LocalInputStream`` in-process)."""

    def peek_spec(self) -> Any:
        """The first batch's nesting with ``meta`` tensors; the batch stays for :meth:`next`."""

    def sample_keys(self) -> list:
        """The sample keys of the workers' first batches (the duplicate check reads them)."""

    def next(self) -> tuple[Any, Any]:
        """The next batch and its ``BatchInfo``."""

    def worker_states(self) -> list:
        """The input position after the batches :meth:`next` returned."""

    def slowest_batch_s(self) -> Optional[float]:
        """The longest a worker took to produce a batch delivered so far."""

    def stall_report(self) -> list[dict]:
        """The workers the next batch waits for, with their stacks."""

    def stats(self) -> dict:
        """The stream's figures for the run report."""

    def close(self) -> None:
        """Stop the stream's workers."""


class InputFeed:
    """Args:
        streams: one input stream per CS-X (a :class:`Stream`).
        policy: the run's :class:`FlowPolicy` (``input_buffer_batches`` bounds each buffer).
        cs_config: the run's layout (the stall bound's settings).
    """

    def __init__(self, streams: list[Stream], policy: FlowPolicy, cs_config: CSConfig):
        self.streams = streams
        self.policy = policy
        self.cs_config = cs_config
        self._buffers: list[queue.Queue] = []
        self._threads: list[threading.Thread] = []
        self._parts: list = []
        self._stop = threading.Event()
        self._stalled = False
        self.autoscaler = None
        """An autoscaled run's :class:`~executor.wafer.autoscaler.RunAutoscaler`: each feeder
        carries out its CS-X's decisions between two batches."""
        specs = self._first_specs()
        self._part_specs = [tree_flatten(sp) for sp in specs]
        for c, (leaves, _) in enumerate(self._part_specs):
            check_leaves(leaves, f"the first batch of CS-X {c}")
        self.spec = concat_parts(specs)

    def _first_specs(self) -> list:
        """Each stream's first batch spec (``peek_spec``), waited for under the stall bound."""
        return self._each_stream_bounded(lambda s: s.peek_spec(), "feeder-first-batches")

    def wait_for_sample_keys(self) -> None:
        """Wait under the stall bound until every stream has the sample keys of its workers'
        first batches (``sample_keys``, which the duplicate check then reads at once)."""
        self._each_stream_bounded(lambda s: s.sample_keys(), "feeder-sample-keys")

    def _each_stream_bounded(self, call, name: str) -> list:
        """``call(stream)`` for each stream in order, in a helper thread, while this one
        watches the wait: past the stall bound it raises the stall error for step 1, naming
        the stream the helper is waiting for."""
        got: dict = {"c": 0}

        def run():
            try:
                out = []
                for c, s in enumerate(self.streams):
                    got["c"] = c
                    out.append(call(s))
                got["out"] = out
            except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
                got["error"] = e

        t0 = time.perf_counter()
        helper = threading.Thread(target=run, name=name, daemon=True)
        helper.start()
        while helper.is_alive():
            helper.join(0.2)
            if helper.is_alive():
                self._raise_if_stalled(0, time.perf_counter() - t0,
                                       lambda: [got["c"]] if helper.is_alive() else [])
        if "error" in got:
            raise got["error"]
        return got["out"]

    # -- feeding -------------------------------------------------------------------------------
    def start(self, num_steps: int, checkpoint_steps: set) -> None:
        self._buffers = [queue.Queue(maxsize=self.policy.input_buffer_batches)
                         for _ in self.streams]
        self._parts = [None] * len(self.streams)
        self._threads = []
        for c, s in enumerate(self.streams):
            t = threading.Thread(target=self._feed, args=(c, s, self._buffers[c], num_steps,
                                                          checkpoint_steps),
                                 name=f"feeder-csx{c}", daemon=True)
            t.start()
            self._threads.append(t)  # close() joins only started threads, even after a Ctrl-C

    def _put(self, buf: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                buf.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _feed(self, c: int, stream, buf: queue.Queue, num_steps: int, checkpoints: set):
        """Pull CS-X ``c``'s batches in step order; keep the input position for checkpoints."""
        try:
            for step in range(num_steps):
                if self._stop.is_set():
                    return
                if self.autoscaler is not None:
                    self.autoscaler.apply(c, stream, step)
                b, info = stream.next()
                self._check_batch(step, c, b, info)
                states = stream.worker_states() if step in checkpoints else None
                if not self._put(buf, (b, info, states)):
                    return
        except BaseException as e:  # handed to the wafer loop, which reports it
            self._put(buf, _Failure(e, traceback.format_exc()))

    def _check_batch(self, step: int, c: int, batch, info) -> None:
        leaves, spec = tree_flatten(batch)
        want_leaves, want_spec = self._part_specs[c]
        where = (f"step {step + 1}, CS-X {c}, worker {info.local_worker_id} (its batch "
                 f"#{info.worker_step})")
        if spec != want_spec:
            raise BatchSpecError(
                f"{where}: the batch structure changed: the traced graph was built for "
                f"{want_spec}, this batch is {spec}. The graph is static: every "
                "batch must have the same structure, shapes and dtypes (use drop_last=True).")
        for i, (got, want) in enumerate(zip(leaves, want_leaves)):
            if not isinstance(got, torch.Tensor) or got.shape != want.shape \
                    or got.dtype != want.dtype:
                check_leaves(leaves, where)
                raise BatchSpecError(
                    f"{where}: leaf {i} of the batch is {tuple(got.shape)} {got.dtype}, the traced "
                    f"graph expects {tuple(want.shape)} {want.dtype}. The graph is static: "
                    "every batch must have the same shapes and dtypes; a short last batch "
                    "is the usual cause (use drop_last=True).")

    # -- taking --------------------------------------------------------------------------------
    def occupancy_per_csx(self) -> list[int]:
        """Batches waiting in each CS-X's buffer."""
        return [b.qsize() for b in self._buffers]

    def take(self, timeout: Optional[float]) -> Optional[StepInput]:
        """The next step's input, or None if some CS-X's part did not arrive within ``timeout``
        (0: do not wait). Parts already taken are kept for the next call."""
        for c, buf in enumerate(self._buffers):
            if self._parts[c] is not None:
                continue
            try:
                item = buf.get_nowait() if not timeout else buf.get(timeout=timeout)
            except queue.Empty:
                return None
            if isinstance(item, _Failure):
                raise item.exc
            self._parts[c] = item
        parts, self._parts = self._parts, [None] * len(self._buffers)
        states = [s for _, _, st in parts for s in (st or [])]
        return StepInput(concat_parts([b for b, _, _ in parts]), [i for _, i, _ in parts],
                         states if any(st is not None for _, _, st in parts) else None)

    # -- stalls ---------------------------------------------------------------------------------
    def stall_bound(self) -> tuple[float, str]:
        """The longest the wafer waits for a step's input, and the rule that gave it
        (:func:`workers.stall.stall_bound`, from the slowest batch any CS-X delivered)."""
        costs = [c for c in (s.slowest_batch_s() for s in self.streams) if c is not None]
        return stall_bound(self.cs_config, max(costs) if costs else None)

    def check_stall(self, step: int, waited_s: float) -> None:
        """Raise :class:`InputStallError` if the wafer has waited ``waited_s`` for the input of
        ``step`` (from 0), longer than :meth:`stall_bound`: naming each CS-X whose part has not
        arrived and the workers that owe it, with their threads' stacks."""
        if waited_s <= self.stall_bound()[0]:
            return
        self._raise_if_stalled(step, waited_s, lambda: [
            c for c, buf in enumerate(self._buffers) if self._parts[c] is None and buf.empty()])

    def _raise_if_stalled(self, step: int, waited_s: float, missing) -> None:
        """The stall error for ``step`` (from 0) if ``waited_s`` is past the bound, naming the
        CS-Xs that ``missing()`` says still owe their part, unless it arrived meanwhile."""
        bound, rule = self.stall_bound()
        if waited_s <= bound:
            return
        csx = missing()
        owed = [o for c in csx for o in self.streams[c].stall_report()]
        if not csx or missing() != csx:  # it arrived while the stacks were gathered
            return
        self._stalled = True
        raise InputStallError(step + 1, waited_s, bound, rule, owed)

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> list:
        """Stop the feeders, close the streams; the streams' final stats. After a stall, a
        feeder stuck in ``input_fn`` in this process is left to end on its own (it is a
        daemon thread); a Ray stream's feeder ends once the stream is closed."""
        self._stop.set()
        first_join_s, last_join_s = (0.0, 2.0) if self._stalled else (2.0, 10.0)
        for t in self._threads:
            t.join(timeout=first_join_s)
        stats = []
        for s in self.streams:
            try:
                stats.append(s.stats())
            finally:
                try:
                    s.close()
                except Exception:  # a feeder blocked in the stream: closing is best effort
                    pass
        for t in self._threads:
            t.join(timeout=last_join_s)
        self._threads, self._buffers, self.streams = [], [], []
        return stats
