"""The wafer driver: the simulated wafer that holds the state and runs the compiled step.

One driver serves a backend for its whole life (several executors): it keeps every state tensor
(weights, optimizer, scheduler, scaler, metric state), the compiled step, and -- during a run --
one input stream per CS-X. Its run loop executes steps back to back in a background thread,
keeps the outputs the client will fetch, snapshots the state on checkpoint steps and records per
step: compute time, time waiting for input and input-buffer occupancy.

The same class runs in-process (tests, debugging) or as a Ray actor (``ray.remote`` with
``max_concurrency`` so fetches run beside the loop).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
import traceback
import warnings
from typing import Any, Optional

import torch
import torch._higher_order_ops.triton_kernel_wrap  # noqa: F401  (unpickling captured graphs)
from torch.utils._pytree import tree_flatten, tree_unflatten

from executor.engine.compiler import compile_step
from executor.engine.handles import LazyInit
from workers.duplicates import check_streams


warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)


class _Failure:
    def __init__(self, exc: BaseException, tb: str):
        self.exc, self.tb = exc, tb


class DriverError(RuntimeError):
    """The wafer failed while running a step."""


class BatchSpecError(ValueError):
    """A batch does not match the spec the step was traced with."""


def _check_leaves(leaves, where: str) -> None:
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


def remap_worker_states(states: list, cs_config) -> list:
    """Resume states for ``cs_config``'s topology.

    States saved with the same topology are used as they are. Otherwise they can be mapped only
    when the workers' loaders keep a position in global-batch units (``ShardedSampler``): every
    new worker then starts at the saved global batch and the round-robin continues from there.
    """
    from workers.context import DataLoaderCheckpoint

    states = [s if isinstance(s, DataLoaderCheckpoint) else DataLoaderCheckpoint(**s)
              for s in states]
    C, W = cs_config.num_csx, cs_config.num_workers_per_csx
    saved = {(s.num_csx, s.num_workers_per_csx) for s in states}
    if saved == {(C, W)}:
        return states
    old = sorted(saved)[0]
    positions = []
    for s in states:
        usd = s.user_state_dict or {}
        ls = usd.get("loader_state")
        if not (isinstance(ls, dict) and "next_global_batch" in ls):
            raise ValueError(
                f"the dataloader state was saved with num_csx={old[0]}, "
                f"num_workers_per_csx={old[1]}, and this run has num_csx={C}, "
                f"num_workers_per_csx={W}; the saved positions are per worker (the input_fn does "
                "not use cstream.utils.data.ShardedSampler), so they cannot be mapped onto "
                "another topology. Resume with the saved CSConfig, or shard with ShardedSampler.")
        positions.append((int(usd.get("epoch", 0)), int(ls["next_global_batch"]), s))
    epoch, nxt, ref = max(positions, key=lambda p: (p[0], p[1]))
    total = sum(s.worker_step for s in states if s.wse_id == 0)
    ref_usd = ref.user_state_dict or {}
    part = ref_usd.get("loader_state_of")
    out = []
    for c in range(C):
        for w in range(W):
            usd = {"epoch": epoch, "batch_in_epoch": 1 if nxt else 0,
                   "loader_state": dict(ref_usd["loader_state"], next_global_batch=nxt,
                                        epoch=epoch)}
            if part:
                usd["loader_state_of"] = part
            if "rng" in ref_usd:  # every worker draws the same global shuffle
                usd["rng"] = ref_usd["rng"]
            out.append(DataLoaderCheckpoint(
                local_worker_id=w, num_workers_per_csx=W, num_csx=C, wse_id=c,
                appliance_step=ref.appliance_step, worker_step=(total - w + W - 1) // W,
                user_state_dict=usd))
    return out


def rss_bytes() -> int:
    """Resident set size of this process (Linux), 0 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _concat(parts: list):
    """Join the per-CS-X sub-batches along the batch dimension (data parallel)."""
    if len(parts) == 1:
        return parts[0]
    flats = [tree_flatten(p) for p in parts]
    spec = flats[0][1]
    for i, (_, s) in enumerate(flats[1:], 1):
        if s != spec:
            raise DriverError(
                f"CS-X {i} received a batch whose structure differs from CS-X 0's ({s} vs {spec})."
            )
    leaves = []
    for column in zip(*(f[0] for f in flats)):
        if isinstance(column[0], torch.Tensor):
            leaves.append(torch.cat(column, dim=0))
        else:
            leaves.append(column[0])
    return tree_unflatten(leaves, spec)


def _timeline_fields(infos: list, end_unix: float) -> dict:
    """The wall-clock times of a step for the run's timeline: its end, and per CS-X when its
    batch was produced by its worker and when it reached the wafer's side of the transport."""
    out = {"end_unix": end_unix}
    if all(i.produced_unix is not None for i in infos):
        out["produce_start_unix"] = [float(i.produced_unix[0]) for i in infos]
        out["produce_end_unix"] = [float(i.produced_unix[1]) for i in infos]
        out["received_unix"] = [float(i.received_unix or i.produced_unix[1]) for i in infos]
    if all(i.produce_cpu_s is not None for i in infos):
        out["produce_cpu_s"] = [float(i.produce_cpu_s) for i in infos]
    return out


class WaferDriver:
    def __init__(self, device: str = "cpu", compile_dir: Optional[str] = None,
                 compiler: str = "fx", use_ray_workers: bool = False):
        self.device = torch.device(device)
        # the wafer's own random stream: the client seeds it (set_rng_state) before each run
        self.rng = torch.Generator(device=self.device)
        self.compile_dir = compile_dir
        self.compiler = compiler
        self.use_ray_workers = use_ray_workers
        self.state: dict[int, torch.Tensor] = {}
        self._step_fn = None
        self._state_order: list[int] = []
        self._consts: list = []
        self._batch_spec = None
        self._lock = threading.Condition()
        self._reset_run()

    # -- state ---------------------------------------------------------------------------------
    def put_state(self, items: dict) -> int:
        """Store values (tensors or :class:`LazyInit` programs, materialised here)."""
        for key, v in items.items():
            if isinstance(v, LazyInit):
                v = v.materialize()
            self.state[key] = v.to(self.device) if v.device != self.device else v.clone()
        return len(items)

    def get_state(self, keys: list) -> dict:
        with self._lock:
            return {k: self.state[k].detach().to("cpu", copy=True) for k in keys}

    def drop_state(self, keys: list) -> None:
        for k in keys:
            self.state.pop(k, None)

    def has_state(self, keys: list) -> list:
        return [k for k in keys if k not in self.state]

    # -- program -------------------------------------------------------------------------------
    def load_program(self, graph, state_order: list, consts: list, batch_metas: list,
                     state_metas: Optional[list] = None, compile_only: bool = False) -> dict:
        """Compile the captured step against the resident state (``graph`` None: no model).

        ``compile_only``: the weights were dropped; compile against zeros of their spec."""
        self._state_order = list(state_order)
        self._consts = [c.to(self.device) for c in consts]
        if graph is None:
            self._step_fn = None
            return {"compiler": None, "cache_hit": False, "compile_s": 0.0}
        missing = [k for k in state_order if k not in self.state]
        if missing and not compile_only:
            raise DriverError(f"{len(missing)} state tensors have no value on the wafer.")
        if compile_only:
            state = [torch.zeros(s, dtype=d, device=self.device) for s, d in state_metas]
        else:
            state = [self.state[k] for k in state_order]
        batch = [torch.zeros(s, dtype=d, device=self.device) for s, d in batch_metas]
        step, report = compile_step(graph, (state, batch, self._consts), self.compiler,
                                    str(self.device), self.compile_dir, generator=self.rng)
        self._step_fn = step
        return report

    # -- randomness ------------------------------------------------------------------------------
    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue the wafer's random stream from the client's generator state (a CPU
        generator's state; a CUDA wafer seeds its own generator from it)."""
        if self.device.type == "cpu":
            self.rng.set_state(state)
        else:
            self.rng.manual_seed(int.from_bytes(hashlib.sha256(state.numpy().tobytes())
                                                .digest()[:8], "little"))

    def get_rng_state(self) -> torch.Tensor:
        return self.rng.get_state()

    # -- a run ---------------------------------------------------------------------------------
    def _reset_run(self):
        self._streams = []
        self._buffers = []
        self._feeders = []
        self._thread = None
        self._done = -1
        self._acked = -1
        self._outputs: dict[int, list] = {}
        self._fed_consts: dict[int, Optional[list]] = {}  # step -> plain-tensor arguments
        self._snapshots: dict[int, dict] = {}
        self._worker_states: dict[int, list] = {}
        self._stats: list[dict] = []
        self._stats_sent = 0
        self._error: Optional[str] = None
        self._stop = False
        self._started = False
        self._run_cfg = None
        self._t_start = None
        self._duplicates = None

    def open_input(self, dataloader, cs_config, resume_states=None, in_flight_per_worker=2):
        """Create one input stream per CS-X (the workers start streaming into its buffer)."""
        self._reset_run()
        if self.use_ray_workers:
            from workers.stream import CsxInputStream as Stream
        else:
            from workers.local_stream import LocalInputStream as Stream
        self.cs_config = cs_config
        if resume_states:
            resume_states = remap_worker_states(resume_states, cs_config)
        for c in range(cs_config.num_csx):
            states = None
            if resume_states is not None:
                states = [s for s in resume_states if s.wse_id == c]
            self._streams.append(Stream(dataloader, cs_config, c, resume_states=states,
                                        in_flight_per_worker=in_flight_per_worker,
                                        zero_copy=True))
        specs = [s.peek_spec() for s in self._streams]
        report = check_streams(self._streams, dataloader.input_fn_name,
                               cs_config.duplicate_samples)
        self._duplicates = None if report is None else report.to_dict()
        self._part_specs = [tree_flatten(sp) for sp in specs]
        for c, (leaves, _) in enumerate(self._part_specs):
            _check_leaves(leaves, f"the first batch of CS-X {c}")
        return _concat(specs) if len(specs) > 1 else specs[0]

    def input_checks(self) -> dict:
        """What the checks of the input side found when the run's input opened:
        ``{"duplicates": report dict or None}`` (see :mod:`workers.duplicates`)."""
        return {"duplicates": self._duplicates}

    def _check_batch(self, step: int, c: int, batch, info) -> None:
        leaves, spec = tree_flatten(batch)
        want_leaves, want_spec = self._part_specs[c]
        where = (f"step {step + 1}, CS-X {c}, worker {info.local_worker_id} (its batch "
                 f"#{info.worker_step})")
        if spec != want_spec:
            raise BatchSpecError(
                f"{where}: the batch structure changed: the traced graph was built for "
                f"{want_spec}, this batch is {spec}. The graph is static (seed 002): every "
                "batch must have the same structure, shapes and dtypes (use drop_last=True).")
        _check_leaves(leaves, where)
        for i, (got, want) in enumerate(zip(leaves, want_leaves)):
            if got.shape != want.shape or got.dtype != want.dtype:
                raise BatchSpecError(
                    f"{where}: leaf {i} of the batch is {tuple(got.shape)} {got.dtype}, the traced "
                    f"graph expects {tuple(want.shape)} {want.dtype}. The graph is static (seed "
                    "002): every batch must have the same shapes and dtypes; a short last batch "
                    "is the usual cause (use drop_last=True).")

    def start(self, num_steps: int, checkpoint_steps: list, lookahead: int) -> None:
        self._run_cfg = dict(num_steps=num_steps, checkpoint_steps=set(checkpoint_steps),
                             lookahead=lookahead)
        self._started = True
        self._t_start = time.perf_counter()
        # one feeder per CS-X fills that CS-X's bounded input buffer from its workers, so the
        # wafer takes ready batches without paying the transport on its own time
        capacity = max(int(getattr(self.cs_config, "input_buffer_batches", 4)), 1)
        self._buffers = [queue.Queue(maxsize=capacity) for _ in self._streams]
        self._feeders = [
            threading.Thread(target=self._feed, args=(c, s, self._buffers[c], num_steps,
                                                      self._run_cfg["checkpoint_steps"]),
                             name=f"feeder-csx{c}", daemon=True)
            for c, s in enumerate(self._streams)]
        for f in self._feeders:
            f.start()
        self._thread = threading.Thread(target=self._loop, name="wafer", daemon=True)
        self._thread.start()

    def _feed(self, c: int, stream, buf: "queue.Queue", num_steps: int, checkpoints: set):
        """Pull CS-X ``c``'s batches in step order; keep the input position for checkpoints."""
        try:
            for step in range(num_steps):
                if self._stop:
                    return
                b, info = stream.next()
                self._check_batch(step, c, b, info)
                states = stream.worker_states() if step in checkpoints else None
                item = (b, info, states)
                while not self._stop:
                    try:
                        buf.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the wafer loop, which reports it
            while not self._stop:
                try:
                    buf.put(_Failure(e, traceback.format_exc()), timeout=0.2)
                    return
                except queue.Full:
                    continue

    def _take(self, c: int):
        buf = self._buffers[c]
        while True:
            try:
                item = buf.get(timeout=0.2)
            except queue.Empty:
                if self._stop:
                    raise DriverError("the run was stopped") from None
                continue
            if isinstance(item, _Failure):
                raise item.exc
            return item

    def _loop(self):
        cfg = self._run_cfg
        order = self._state_order
        try:
            for step in range(cfg["num_steps"]):
                with self._lock:
                    while not self._stop and step > self._acked + cfg["lookahead"]:
                        self._lock.wait(0.5)
                    if self._stop:
                        return
                occupancy = sum(b.qsize() for b in self._buffers) / len(self._buffers)
                t0 = time.perf_counter()
                parts, infos, states = [], [], []
                for c in range(len(self._streams)):
                    b, info, st = self._take(c)
                    parts.append(b)
                    infos.append(info)
                    states.extend(st or [])
                batch = _concat(parts)
                t1 = time.perf_counter()
                leaves, _ = tree_flatten(batch)
                leaves = [t.to(self.device) if isinstance(t, torch.Tensor) else t for t in leaves]
                samples = int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1
                outputs = []
                if self._step_fn is not None:
                    state = [self.state[k] for k in order]
                    consts = self._consts_of(step) if self._consts else self._consts
                    outputs = self._step_fn(state, [t for t in leaves if isinstance(
                        t, torch.Tensor)], consts)
                    for k, v in zip(order, state):
                        self.state[k] = v
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                floor_s = self.cs_config.min_step_seconds(samples // max(len(self._streams), 1))
                remaining = floor_s - (time.perf_counter() - t1)
                if remaining > 0:
                    time.sleep(remaining)  # the simulated wafer's speed
                t2 = time.perf_counter()
                end_unix = time.time()
                with self._lock:
                    self._outputs[step] = [o.detach() for o in outputs]
                    if step in cfg["checkpoint_steps"]:
                        self._snapshots[step] = {k: self.state[k].detach().to("cpu", copy=True)
                                                 for k in order or self.state}
                        self._snapshots[step]["rng"] = self.rng.get_state()
                        self._worker_states[step] = states
                    self._stats.append({
                        "step": step + 1, "samples": samples, "compute_s": t2 - t1,
                        "wafer_t": t2 - self._t_start,
                        "input_wait_s": t1 - t0, "buffer_occupancy": occupancy,
                        "workers": [i.local_worker_id for i in infos],
                        "bytes": sum(i.nbytes for i in infos),
                        **_timeline_fields(infos, end_unix),
                    })
                    self._done = step
                    self._lock.notify_all()
        except BaseException as e:  # reported to the client with the traceback
            with self._lock:
                self._error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
                self._error_exc = e
                self._lock.notify_all()

    def feed_consts(self, step: int, values: Optional[list]) -> None:
        """The plain-tensor arguments the client called ``step`` with (None: unchanged)."""
        with self._lock:
            self._fed_consts[step] = values
            self._lock.notify_all()

    def _consts_of(self, step: int) -> list:
        """Step ``step``'s plain-tensor arguments: waits until the client has called it."""
        with self._lock:
            while step not in self._fed_consts:
                if self._stop:
                    raise DriverError("the run was stopped")
                self._lock.wait(0.2)
            values = self._fed_consts.pop(step)
        if values is not None:
            self._consts = [c.to(self.device) for c in values]
        return self._consts

    def _raise_if_failed(self):
        if self._error is not None:
            exc = getattr(self, "_error_exc", None)
            if exc is not None and (type(exc).__module__.startswith("workers")
                                    or isinstance(exc, BatchSpecError)):
                raise exc
            raise DriverError(f"the wafer failed while running: {self._error}")

    def wait_done(self, step: int, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.perf_counter() + timeout
        with self._lock:
            while self._done < step:
                self._raise_if_failed()
                if self._thread is None or not self._thread.is_alive():
                    self._raise_if_failed()
                    if self._done < step:
                        raise DriverError(f"the wafer stopped before step {step + 1}.")
                if deadline is not None and time.perf_counter() > deadline:
                    break
                self._lock.wait(0.2)
            return self._done

    def fetch(self, step: int, indices: list) -> tuple[list, list]:
        """The outputs ``indices`` of ``step`` (waits for the step), and new per-step stats."""
        self.wait_done(step)
        with self._lock:
            outs = self._outputs[step]
            values = [outs[i].to("cpu", copy=True) for i in indices]
            return values, self._take_stats()

    def _take_stats(self):
        new = self._stats[self._stats_sent:]
        self._stats_sent = len(self._stats)
        return new

    def snapshot(self, step: int, keys: list) -> dict:
        self.wait_done(step)
        with self._lock:
            snap = self._snapshots.get(step)
            if snap is None:
                raise DriverError(f"step {step + 1} is not a checkpoint step; no snapshot was kept.")
            return {k: snap[k] for k in keys}

    def worker_states(self, step: int) -> list:
        self.wait_done(step)
        with self._lock:
            return self._worker_states.get(step, [])

    def ack(self, step: int) -> int:
        """The client finished ``step``: its outputs and snapshot can go."""
        with self._lock:
            self._acked = max(self._acked, step)
            for s in [s for s in self._outputs if s <= step]:
                del self._outputs[s]
            for s in [s for s in self._snapshots if s <= step]:
                del self._snapshots[s]
            self._lock.notify_all()
            # a failure is raised where the client needs a step the wafer did not finish
            # (wait_done, fetch, finish), so every finished step keeps its closures
            return self._done

    def finish(self, wait: bool = True) -> dict:
        """End the run: wait for the loop (or stop it), close the input side, report."""
        if self._thread is not None:
            if wait:
                self._thread.join()
            else:
                with self._lock:
                    self._stop = True
                    self._lock.notify_all()
                self._thread.join(timeout=30)
        with self._lock:
            self._stop = True  # feeders still prefetching (after an error) stop
            self._lock.notify_all()
        for f in self._feeders:
            f.join(timeout=2)
        summary = {"steps": self._done + 1, "stats": self._take_stats(), "workers": [],
                   "rng_state": self.rng.get_state()}
        for s in self._streams:
            try:
                summary["workers"].append(s.stats())
            finally:
                try:
                    s.close()
                except Exception:  # a feeder blocked in the stream: closing is best effort
                    pass
        for f in self._feeders:
            f.join(timeout=10)
        self._feeders, self._buffers = [], []
        self._streams = []
        if self._t_start is not None:
            summary["wafer_wall_s"] = time.perf_counter() - self._t_start
        error = self._error
        self._thread = None
        if wait and error is not None:
            self._raise_if_failed()
        return summary

    def ping(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"device": str(self.device), "state_tensors": len(self.state),
                    "state_bytes": sum(t.numel() * t.element_size() for t in self.state.values()),
                    "rss_bytes": rss_bytes(), "outputs_kept": len(self._outputs),
                    "snapshots_kept": len(self._snapshots), "done": self._done}
