"""The wafer driver: the simulated wafer that holds the state and runs the compiled step.

One driver serves a backend for its whole life (several executors). It puts together the parts
in :mod:`executor.wafer`: the resident state, the program (the compiled step, tiered), and --
during a run -- the input feed (one input stream per CS-X) and the loop that runs steps back to
back in the wafer thread, keeps the outputs the client collects, snapshots the state on
checkpoint steps and records per step: compute time, time waiting for input and input-buffer
occupancy.

The same class runs in-process (``in_process=True``) or as a Ray actor (``ray.remote`` with
``max_concurrency`` so the client's calls run beside the loop). It uses ``num_threads`` threads
for the step's ops.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from executor.engine.compiler import CacheEntry, cache_key, input_spec
from executor.engine.devices import DeviceBoundError, check_device_clean
from executor.wafer import cuda_graph as cuda_graphs
from executor.wafer.compute_thread import ComputeThread
from executor.wafer.feed import BatchSpecError, InputFeed
from executor.wafer.heap import keep_freed_memory, keep_freed_memory_here
from executor.wafer.loop import Collected, DriverError, Phase, RunPlan, WaferLoop
from executor.wafer import autoscaler as autoscale
from executor.wafer.autoscaler import RunAutoscaler
from workers.errors import AutoscaleError
from executor.wafer.program import Program
from executor.wafer.state import StateStore
from workers import torch_compat
from workers.duplicates import check_streams
from workers.flow import FlowPolicy
from workers.torch_compat import import_for_unpickling_graphs

__all__ = ["BatchSpecError", "Collected", "DriverError", "WaferDriver", "rss_bytes"]


warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)


HEAVY_STEP_FLOPS = 50e6
"""A step with this many matrix-multiply FLOPs or more runs on all of the node's CPUs (about a
millisecond of one core's work and up: the cores' time is then spent in the kernels)."""

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default: (0, 1), _aten.addmm.default: (1, 2), _aten.bmm.default: (0, 1),
            _aten.baddbmm.default: (1, 2)}  # the op and where its two operands are


def matmul_flops(gm: torch.fx.GraphModule) -> int:
    """The FLOPs of the matrix multiplies in one step of the captured graph (from the shapes
    its nodes recorded at capture)."""
    total = 0
    for node in gm.graph.nodes:
        pos = _MATMULS.get(node.target) if node.op == "call_function" else None
        if pos is None:
            continue
        try:
            a, b = (node.args[i].meta["val"].shape for i in pos)
        except (AttributeError, KeyError, IndexError):
            continue
        batch = a[0] if len(a) == 3 else 1
        total += 2 * batch * a[-2] * a[-1] * b[-1]
    return int(total)


def threads_for_step(flops: int, cpus: int) -> int:
    """The driver's threads when the user gave none: all of the node's CPUs for a step heavy
    in matrix multiplies (:data:`HEAVY_STEP_FLOPS`), else half of them, at least one. A light
    step's ops are too short to share among threads, and the client and the input workers
    need the other cores: an op's thread that waits for a core held by another process stalls
    the whole step. Chosen from the graph, so it is the same in every run of the step."""
    return max(1, cpus if flops >= HEAVY_STEP_FLOPS else cpus // 2)


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


class WaferDriver:
    """Args:
        device: where the step executes (``"cpu"``, ``"cuda"``).
        compile_dir: the compile cache (an absolute path, resolved by the client).
        compiler: ``"auto"`` (fx now, inductor tiered in), ``"fx"`` or ``"inductor"``.
        use_ray_workers: input workers are Ray actors (else built in this process).
        num_threads: threads for the step's ops (``torch.set_num_threads``); None: chosen
            from ``cpus`` when given (:func:`threads_for_step`), else left as is.
        cpus: the CPUs of the driver's node, for choosing the thread count.
        cuda_graph: on a CUDA device, replay the step as a CUDA graph (``"auto"``, True,
            False: :class:`executor.backends.options.CSXOptions`).
    """

    def __init__(self, device: str = "cpu", compile_dir: Optional[str] = None,
                 compiler: str = "auto", use_ray_workers: bool = False,
                 num_threads: Optional[int] = None, cpus: Optional[int] = None,
                 cuda_graph="auto"):
        # before the compute and tier-up threads enter fake modes (inductor compiles in them)
        torch_compat.install_fake_cuda_guard_here()
        if use_ray_workers:  # an actor: captured graphs arrive pickled, and unpickling needs it
            import_for_unpickling_graphs()
            self.heap = keep_freed_memory()  # the actor's process is cstream's own
        else:  # in the client's process
            self.heap = keep_freed_memory_here()
        self.device = torch.device(device)
        # the wafer's own random stream: the client seeds it (set_rng_state) before each run
        self.rng = torch.Generator(device=self.device)
        self.compile_dir = Path(compile_dir) if compile_dir else None
        self.compiler = compiler
        self.cuda_graph = cuda_graph
        self._graph_plan: Optional[cuda_graphs.GraphPlan] = None
        self.use_ray_workers = use_ray_workers
        self._cpus = cpus if num_threads is None else None  # choose per program
        if num_threads is None and cpus is not None:
            num_threads = threads_for_step(0, cpus)  # until a program says how heavy it is
        # the state, the program and the steps are computed on one thread (see
        # executor.wafer.compute_thread); the loop of a run holds it until the run ends
        self._compute = ComputeThread()

        def set_threads() -> int:
            if num_threads is not None:
                torch.set_num_threads(num_threads)
            return torch.get_num_threads()  # as the compute thread sees it
        self.num_threads = self._compute.call(set_threads, "setting its threads")
        self.threads_chosen: Optional[dict] = None
        self.store = StateStore(self.device)
        self._graph = None
        self._example = None
        self._program: Optional[Program] = None
        self._state_order: list[int] = []
        self._lock = threading.Lock()
        self._feed: Optional[InputFeed] = None
        self._loop: Optional[WaferLoop] = None
        self._run_done: Optional[concurrent.futures.Future] = None  # the loop's end
        self.cs_config = None
        self.policy: Optional[FlowPolicy] = None
        self._duplicates: Optional[dict] = None
        self._autoscaler: Optional[RunAutoscaler] = None
        self._autoscale_not_possible: Optional[str] = None

    # -- state ---------------------------------------------------------------------------------
    def _computed(self, fn, what: str):
        """``fn()`` on the compute thread, or here while a run's loop holds that thread."""
        return fn() if self._alive() else self._compute.call(fn, what)

    def put_state(self, items: dict) -> int:
        return self._computed(lambda: self.store.put(items), "storing the state it was sent")

    def get_state(self, keys: list) -> dict:
        def read():
            with self._loop.cond if self._loop is not None else self._lock:
                return self.store.get(keys)
        return self._computed(read, "reading the state")

    # -- program -------------------------------------------------------------------------------
    def load_program(self, graph, state_order: list, consts: list, batch_metas: list,
                     state_metas: Optional[list] = None, compile_only: bool = False,
                     num_steps: Optional[int] = None,
                     matmul_flops_per_step: Optional[int] = None,
                     graph_code: Optional[str] = None, retrace: bool = False) -> dict:
        """Compile the captured step against the resident state (``graph`` None: no model).

        ``compile_only``: the weights were dropped; compile against zeros of their spec (with
        ``compiler="auto"`` or ``"inductor"`` the inductor artifact is compiled into the cache,
        so the next run starts from it). ``matmul_flops_per_step``: :func:`matmul_flops` of
        the graph, counted by the client (a pickled graph arrives without its nodes' shapes);
        None: counted here. ``graph_code``: the graph's code as captured, the compile cache's
        key (a pickled graph arrives with its code generated anew, other text for the same
        graph: keyed on it, a Ray driver and an in-process one would not share artifacts);
        None: ``graph.code``. ``retrace``: the client traces the step every iteration
        (``retrace_every_iteration``); a CUDA graph is then not recorded."""
        return self._compute.call(lambda: self._load_program(
            graph, state_order, consts, batch_metas, state_metas, compile_only, num_steps,
            matmul_flops_per_step, graph_code, retrace), "compiling the step")

    def _load_program(self, graph, state_order: list, consts: list, batch_metas: list,
                      state_metas: Optional[list], compile_only: bool, num_steps: Optional[int],
                      matmul_flops_per_step: Optional[int], graph_code: Optional[str],
                      retrace: bool) -> dict:
        self._state_order = list(state_order)
        self._graph_plan = None
        if graph is None:
            self._program = None
            return {"compiler": None, "cache_hit": False, "compile_s": 0.0,
                    "num_threads": self.num_threads}
        if self.device.type != "cpu":
            # here torch has the device's kernels to look up: an op the client's check could
            # only judge by name is judged by the dispatcher
            try:
                check_device_clean(graph, self.device)
            except DeviceBoundError as e:
                raise DriverError(str(e)) from None
        missing = self.store.missing(state_order)
        if missing and not compile_only:
            raise DriverError(f"{len(missing)} state tensors have no value on the wafer.")
        if compile_only:
            state = [torch.zeros(s, dtype=d, device=self.device) for s, d in state_metas]
        else:
            state = self.store.in_order(state_order)
        batch = [torch.zeros(s, dtype=d, device=self.device) for s, d in batch_metas]
        example = (state, batch, [c.to(self.device) for c in consts])
        if self._cpus is not None:
            flops = matmul_flops(graph) if matmul_flops_per_step is None \
                else matmul_flops_per_step
            self.num_threads = threads_for_step(flops, self._cpus)
            torch.set_num_threads(self.num_threads)
            self.threads_chosen = {"matmul_flops_per_step": flops, "node_cpus": self._cpus,
                                   "num_threads": self.num_threads}
        entry = None
        if self.compile_dir is not None:  # after the thread count is chosen: it is in the key
            entry = CacheEntry(self.compile_dir, cache_key(
                graph_code or graph.code, input_spec(example), str(self.device),
                torch.get_num_threads() if self.device.type == "cpu" else None))
        compiler = self.compiler
        if compile_only and compiler == "auto":
            compiler = "inductor"
        if self.device.type == "cuda" and not compile_only:
            self._graph_plan = cuda_graphs.plan(graph, cuda_graphs.spec_of(
                [*example[0], *example[1], *example[2]]), self.device, option=self.cuda_graph,
                retrace=retrace)
            if self.cuda_graph is True and not self._graph_plan.record:
                raise DriverError(
                    "cuda_graph=True, but the step cannot be recorded as a CUDA graph:\n  "
                    + "\n  ".join(self._graph_plan.reasons)
                    + '\nSet cuda_graph="auto" to run it with the plain replay.')
        self._program = Program(graph, example, compiler, str(self.device), entry, num_steps,
                                generator=self.rng)
        if self._graph_plan is not None:
            self._program.report["cuda_graph"] = self._graph_plan.to_dict()
        return {**self._program.report, "num_threads": self.num_threads,
                "threads_chosen": self.threads_chosen}

    # -- randomness ------------------------------------------------------------------------------
    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue the wafer's random stream from ``state``: its own generator's state (as
        ``get_rng_state`` gave it), or on a CUDA wafer also a CPU generator's state (the
        client's), which seeds it."""
        if self.device.type == "cpu" or state.numel() == self.rng.get_state().numel():
            self.rng.set_state(state)
        else:
            self.rng.manual_seed(int.from_bytes(hashlib.sha256(state.numpy().tobytes())
                                                .digest()[:8], "little"))

    def get_rng_state(self) -> torch.Tensor:
        return self.rng.get_state()

    # -- a run ---------------------------------------------------------------------------------
    def open_input(self, dataloader, cs_config, resume_states, policy: FlowPolicy,
                   workers_ahead=None):
        """Create one input stream per CS-X (the workers start streaming) and return the
        first batch's spec. ``workers_ahead``: on Ray, the input workers the client started
        while this driver started (:func:`workers.stream.start_workers_ahead`); the streams
        take them, and those left over are killed."""
        try:
            return self._open_input(dataloader, cs_config, resume_states, policy,
                                    workers_ahead)
        finally:
            if workers_ahead is not None:
                from workers.stream import kill_workers

                kill_workers(workers_ahead)

    def _open_input(self, dataloader, cs_config, resume_states, policy, workers_ahead):
        self._close_run()
        if self.use_ray_workers:
            from workers.stream import configured_stream as Stream
        else:
            workers_ahead = None  # in-process streams start no workers
            from workers.local_stream import LocalInputStream as Stream
        self.cs_config = cs_config
        self.policy = policy
        self._autoscale_not_possible = None
        autoscale_state = None
        if cs_config.autoscaling:
            try:
                autoscale.check_stream_kind(self.use_ray_workers)
            except AutoscaleError as refusal:
                cs_config = autoscale.fixed_where_unchangeable(cs_config, refusal)
                self.cs_config = cs_config
                self._autoscale_not_possible = str(refusal)
        if cs_config.autoscaling:
            autoscale_state = (getattr(dataloader, "resume_state", None) or {}).get("autoscale")
        layouts = autoscale.start_layouts(cs_config, resume_states)
        streams = []
        try:
            for c, (cfg, states) in enumerate(layouts):
                streams.append(Stream(dataloader, cfg, c, resume_states=states,
                                      zero_copy=True, policy=self.policy,
                                      workers_ahead=None if workers_ahead is None
                                      else workers_ahead[c]))
            self._feed = InputFeed(streams, self.policy, cs_config)
            self._feed.wait_for_sample_keys()
            report = check_streams(streams, dataloader.input_fn_name,
                                   cs_config.duplicate_samples)
            self._duplicates = None if report is None else report.to_dict()
            self._autoscaler = None
            if cs_config.autoscaling:
                try:
                    autoscale.check_reformable(streams, dataloader.input_fn_name)
                except AutoscaleError as refusal:
                    cs_config = autoscale.fixed_where_unchangeable(cs_config, refusal)
                    self.cs_config = cs_config
                    self._autoscale_not_possible = str(refusal)
            if cs_config.autoscaling:
                self._autoscaler = RunAutoscaler(
                    cs_config, [s.active_workers() for s in streams],
                    self.policy.input_buffer_batches,
                    cluster_cpus=autoscale.cluster_cpus, state=autoscale_state)
                self._feed.autoscaler = self._autoscaler
        except BaseException:
            for s in streams:
                s.close()
            raise
        return self._feed.spec

    def input_checks(self) -> dict:
        """What the checks of the input side found when the run's input opened:
        ``{"duplicates": report dict or None}`` (see :mod:`workers.duplicates`)."""
        return {"duplicates": self._duplicates}

    def start(self, num_steps: int, checkpoint_steps: list) -> None:
        cfg = self.cs_config
        plan = RunPlan(num_steps=num_steps, checkpoint_steps=frozenset(checkpoint_steps),
                       num_csx=cfg.num_csx, min_step_seconds=cfg.min_step_seconds)
        self._feed.start(num_steps, plan.checkpoint_steps)
        if self._program is not None:
            self._program.num_steps = num_steps
        runner = None
        if self._graph_plan is not None and self._program is not None:
            runner = cuda_graphs.CudaStepRunner(self.device, self._graph_plan,
                                                self._program.report.setdefault("cuda_graph", {}))
        self._loop = WaferLoop(self.store, self._feed, self._program, self._state_order, plan,
                               self.policy, self.device, rng=self.rng, runner=runner,
                               autoscaler=self._autoscaler)
        self._run_done = self._compute.submit(self._loop.run)

    def _alive(self) -> bool:
        return self._run_done is not None and not self._run_done.done()

    def _running(self) -> WaferLoop:
        if self._loop is None:
            raise DriverError("no run has started on the wafer.")
        return self._loop

    def collect(self, since: int, until: int, indices: list, ack: int = -1,
                more: int = 0) -> Collected:
        """Every finished step's outputs ``indices`` from ``since`` on, once ``until`` is done
        (and up to ``more`` steps after it); acknowledges ``ack`` first (see
        :meth:`WaferLoop.collect`)."""
        return self._running().collect(since, until, indices, ack, alive=self._alive, more=more)

    def fetch(self, step: int, indices: list) -> tuple[list, list]:
        return self._running().fetch(step, indices, alive=self._alive)

    # a remote client's calls: tensors as numpy-backed packs, which Ray sends as raw buffers
    # (a torch tensor would go through torch.save and torch.load, ~0.1 ms each way per tensor)
    def collect_packed(self, since: int, until: int, indices: list, ack: int = -1,
                       more: int = 0) -> Collected:
        from workers.wire import pack_tensor

        got = self.collect(since, until, indices, ack, more)
        got.values = [pack_tensor(v) for v in got.values]
        return got

    def fetch_packed(self, step: int, indices: list) -> tuple[list, list]:
        from workers.wire import pack_tensor

        values, stats = self.fetch(step, indices)
        return [pack_tensor(v) for v in values], stats

    def wait_done(self, step: int, timeout: Optional[float] = None) -> int:
        return self._running().wait_done(step, timeout, alive=self._alive)

    def ack(self, step: int) -> int:
        return self._running().ack(step)

    def feed_consts(self, step: int, values: Optional[list]) -> None:
        """The plain-tensor arguments the client called ``step`` with (None: unchanged)."""
        self._running().feed_consts(step, values)

    def snapshot(self, step: int, keys: list) -> dict:
        loop = self._running()
        loop.wait_done(step, alive=self._alive)
        with loop.cond:
            snap = loop.snapshots.get(step)
            if snap is None:
                raise DriverError(f"step {step + 1} is not a checkpoint step; no snapshot was kept.")
            return {k: snap[k] for k in keys}

    def worker_states(self, step: int) -> list:
        loop = self._running()
        loop.wait_done(step, alive=self._alive)
        with loop.cond:
            return loop.worker_states.get(step, [])

    def autoscale_state(self, step: int) -> Optional[dict]:
        """The autoscaling controller's state as it was after checkpoint step ``step`` (None:
        the run does not autoscale)."""
        loop = self._running()
        loop.wait_done(step, alive=self._alive)
        with loop.cond:
            return loop.autoscale_states.get(step)

    def finish(self, wait: bool = True) -> dict:
        """End the run: wait for the loop (or stop it), close the input side, report."""
        loop = self._loop
        if loop is None:
            self._close_run()
            return {"steps": 0, "stats": [], "workers": []}
        if self._run_done is not None:
            if not wait:
                loop.stop()
            concurrent.futures.wait([self._run_done], timeout=None if wait else 30)
        loop.stop()
        summary = {"steps": loop.done + 1, "stats": loop.take_stats(),
                   "wafer_wall_s": time.perf_counter() - loop.t_start,
                   "wafer_phase": loop.phase.value, "num_threads": self.num_threads,
                   "heap": self.heap, "rng_state": self.rng.get_state(),
                   "flow_policy": self.policy.to_dict()}
        if self._program is not None:
            summary["program"] = dict(self._program.report)
        autoscaler = self._autoscaler
        summary["workers"] = self._close_run()
        if autoscaler is not None:
            summary["autoscale"] = autoscaler.summary()
        if self._autoscale_not_possible is not None:
            summary["autoscale_not_possible"] = self._autoscale_not_possible
        if wait and loop.phase is Phase.FAILED:
            loop.raise_if_failed()
        return summary

    def close(self) -> None:
        """End the run, if one is on, and the compute thread (a driver in the client's
        process; a Ray actor's thread ends with its process)."""
        try:
            self.finish(wait=False)
        finally:
            self._compute.close()

    def _close_run(self) -> list:
        stats = self._feed.close() if self._feed is not None else []
        self._feed = None
        self._loop = None
        self._run_done = None
        return stats

    def ping(self) -> dict:
        """Where this driver runs: ``{"node_id", "node_ip", "pid"}`` (as a Ray actor; in
        this process, this process's)."""
        import os

        if not self.use_ray_workers:
            return {"node_id": None, "node_ip": None, "pid": os.getpid()}
        from workers.placement import where

        return where()

    def describe(self) -> dict[str, Any]:
        loop = self._loop
        return {"device": str(self.device), "state_tensors": len(self.store),
                "state_bytes": self.store.nbytes(), "rss_bytes": rss_bytes(),
                "num_threads": self.num_threads, "heap": self.heap,
                "outputs_kept": len(loop.outputs) if loop else 0,
                "snapshots_kept": len(loop.snapshots) if loop else 0,
                "done": loop.done if loop else -1,
                "phase": loop.phase.value if loop else None}
