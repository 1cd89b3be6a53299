"""Talking to the wafer driver: one typed interface, in-process or to a Ray actor.

:class:`DriverClient` (a ``Protocol``) declares every call the client makes, once;
:class:`LocalDriverClient` calls the driver in this process and :class:`RayDriverClient` sends
the same calls to the driver actor (its replies of outputs packed, :func:`_unpacked`). The
Ray actor (and Ray itself, when embedded) is started in a background thread as soon as the
backend exists, so Ray's start-up overlaps the user building the model; the first call waits
for it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from typing import Optional, Protocol

from executor.driver import Collected, DriverError, WaferDriver
from executor.phases import phase

INPUT_RESERVE_CPUS = 0.25
"""CPUs of the driver's node the driver leaves unreserved for input workers (0.01 each)."""


def input_side_error(error: BaseException) -> BaseException | None:
    """The input side's own exception (``InputWorkerError``, ``EmptyDataLoaderError``, ...)
    that a Ray error from the driver actor carries, ready to raise in the client: its message
    as the input side wrote it, no Ray header, its traceback starting here; the Ray error stays
    reachable as ``__cause__``. None for any other error."""
    cause = getattr(error, "cause", None)
    if cause is None or not type(cause).__module__.startswith("workers."):
        return None
    cause = cause.with_traceback(None)
    cause.__cause__ = error
    cause.__suppress_context__ = True
    return cause


def _ray_get(ref):
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        mine = input_side_error(e)
        if mine is None:
            raise
    raise mine


def _unpacked(values: list) -> list:
    """The tensors of :meth:`WaferDriver.collect_packed`'s or ``fetch_packed``'s reply, each on
    memory of its own (a closure may keep or change it)."""
    from workers.wire import PackedTensor, unpack_tensor

    return [unpack_tensor(v) if isinstance(v, PackedTensor) else v for v in values]


class Future:
    """The result of an asynchronous call (``get``: reads ``ref``'s value, raising the
    client's errors; default :func:`_ray_get`)."""

    def __init__(self, value=None, error: Optional[BaseException] = None, ref=None, get=None):
        self._value, self._error, self._ref = value, error, ref
        self._get = get or _ray_get

    def ready(self) -> bool:
        if self._ref is None:
            return True
        import ray

        done, _ = ray.wait([self._ref], timeout=0)
        return bool(done)

    def result(self):
        if self._ref is not None:
            return self._get(self._ref)
        if self._error is not None:
            raise self._error
        return self._value


class DriverClient(Protocol):
    """The calls the client makes to the wafer driver, each declared once here (the driver's
    method of the same name, :class:`WaferDriver`, says what it does). A client implements
    :meth:`_call` (a call that returns its result) and :meth:`_call_async` (one that returns a
    :class:`Future`); :class:`LocalDriverClient` calls the driver in this process,
    :class:`RayDriverClient` sends the call to the driver actor."""

    startup: dict
    last_checkpoint_step: Optional[int] = None
    """The newest step (counted from 1) whose checkpoint closures finished in the client."""

    @staticmethod
    def create(backend) -> "DriverClient":
        if backend.options.in_process:
            return LocalDriverClient(backend)
        return RayDriverClient(backend)

    def _call(self, name: str, *args, **kwargs): ...
    def _call_async(self, name: str, *args) -> Future: ...

    def put_state(self, items: dict) -> int:
        return self._call("put_state", items)

    def get_state(self, keys: list) -> dict:
        return self._call("get_state", keys)

    def load_program(self, graph, state_order, consts, batch_metas, state_metas=None,
                     compile_only=False, num_steps=None,
                     matmul_flops_per_step=None, graph_code=None, retrace=False) -> dict:
        return self._call("load_program", graph, state_order, consts, batch_metas, state_metas,
                          compile_only, num_steps, matmul_flops_per_step=matmul_flops_per_step,
                          graph_code=graph_code, retrace=retrace)

    def open_input(self, dataloader, cs_config, resume_states, policy):
        return self._call("open_input", dataloader, cs_config, resume_states, policy)

    def start(self, num_steps: int, checkpoint_steps: list) -> None:
        return self._call("start", num_steps, checkpoint_steps)

    def collect(self, since: int, until: int, indices: list, ack: int,
                more: int = 0) -> Collected:
        return self._call("collect", since, until, indices, ack, more)

    def fetch(self, step: int, indices: list) -> tuple:
        return self._call("fetch", step, indices)

    def wait_done(self, step: int) -> int:
        return self._call("wait_done", step)

    def ack_async(self, step: int) -> Future:
        return self._call_async("ack", step)

    def snapshot(self, step: int, keys: list) -> dict:
        return self._call("snapshot", step, keys)

    def snapshot_async(self, step: int, keys: list) -> Future:
        return self._call_async("snapshot", step, keys)

    def set_rng_state(self, state) -> None:
        return self._call("set_rng_state", state)

    def input_checks(self) -> dict:
        return self._call("input_checks")

    def feed_consts_async(self, step: int, values) -> Future:
        return self._call_async("feed_consts", step, values)

    def worker_states(self, step: int) -> list:
        return self._call("worker_states", step)

    def autoscale_state(self, step: int) -> Optional[dict]:
        return self._call("autoscale_state", step)

    def finish(self, wait: bool) -> dict:
        return self._call("finish", wait=wait)

    def describe(self) -> dict:
        return self._call("describe")

    def checkpoint_done(self, step: int) -> None:
        """The client finished the checkpoint closures of ``step`` (counted from 1): a
        failure from here on names it as the step to resume from."""
        self.last_checkpoint_step = step

    def close(self) -> None:
        pass


class LocalDriverClient(DriverClient):
    def __init__(self, backend):
        t0 = time.perf_counter()
        self.driver = WaferDriver(device=backend.driver_device, compile_dir=str(backend.compile_dir),
                                  compiler=backend.options.compiler, use_ray_workers=False,
                                  num_threads=backend.options.num_threads,
                                  cuda_graph=backend.options.cuda_graph)
        self.startup = {"driver_s": time.perf_counter() - t0}

    def _call(self, name, *args, **kwargs):
        return getattr(self.driver, name)(*args, **kwargs)

    def _call_async(self, name, *args):
        try:
            return Future(getattr(self.driver, name)(*args))
        except Exception as e:  # surfaced when the result is read
            return Future(error=e)

    def close(self):
        with contextlib.suppress(Exception):
            self.driver.close()


def default_num_threads() -> int:
    """The CPUs the driver reserves when the user gave no thread count: half those of the
    largest node of the Ray cluster (this machine's when Ray is embedded), at least one; the
    rest is left to the client and the input workers. Its thread count is chosen per step
    (:func:`executor.driver.threads_for_step`)."""
    import ray

    cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    return max(1, int(max(cpus, default=os.cpu_count() or 1)) // 2)


class RayDriverClient(DriverClient):
    """The driver as a Ray actor. Ray is started here (embedded, loopback) unless it runs.

    The actor reserves ``min(num_threads, node CPUs - INPUT_RESERVE_CPUS)`` CPUs and runs the
    step's ops on ``num_threads`` threads (default: chosen from the step,
    :func:`executor.driver.threads_for_step`). Creating the client
    starts Ray (``ray.init`` must run on the main thread) and asks for the actor without waiting
    for it: its process starts while the user builds the model; the first call waits."""

    def __init__(self, backend):
        import ray

        from executor.ray_session import ensure_ray

        t0 = time.perf_counter()
        self.started_ray = ensure_ray(address=backend.options.address)
        t1 = time.perf_counter()
        node_cpus = max(float(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive"))
        threads = backend.options.num_threads or default_num_threads()  # reserved; see WaferDriver
        options = dict(max_concurrency=16, name=f"cstream-wafer-{os.getpid()}-{id(backend):x}",
                       num_cpus=round(max(0.0, min(threads, node_cpus - INPUT_RESERVE_CPUS)), 2))
        if str(backend.driver_device).startswith("cuda"):
            options["num_gpus"] = 1
        self.actor = ray.remote(WaferDriver).options(**options).remote(
            device=backend.driver_device, compile_dir=str(backend.compile_dir),
            compiler=backend.options.compiler, use_ray_workers=True,
            num_threads=backend.options.num_threads,
            cpus=max(1, int(node_cpus)), cuda_graph=backend.options.cuda_graph)
        self._ping = self.actor.ping.remote()
        self.where: dict = {}  # the driver's node, once it answered the ping
        self._dead: Optional[DriverError] = None  # the error that reported its death
        self._input_config = None  # the cs_config of the run's input workers
        self._t_asked = t1
        self.startup = {"ray_start_s": t1 - t0, "num_cpus": options["num_cpus"]}
        atexit.register(self.close)

    def _actor(self):
        if self._dead is not None:
            raise self._dead  # every later call: the first failure, at once
        if self.actor is None:
            raise DriverError("the wafer driver was shut down with its backend; create a new "
                              "backend with cstream.backend(...).")
        if self._ping is not None:
            ping, self._ping = self._ping, None
            with phase("starting the wafer driver"):
                self.where = self._get(ping, "start-up") or {}
            self.startup["driver_ready_s"] = time.perf_counter() - self._t_asked
        return self.actor

    def _get(self, ref, what: str):
        import ray

        try:
            return _ray_get(ref)
        except ray.exceptions.RayActorError as e:
            if self._dead is not None:
                raise self._dead  # the first failure, not a later symptom of it
            self._dead = self._died(what, e)
            raise self._dead from e

    def _died(self, what: str, e: BaseException) -> DriverError:
        """The error for the driver's death during ``what``; the run's input workers, which
        would otherwise go on producing until Ray notices, are stopped first."""
        from workers.stream import kill_named_workers

        stopped = kill_named_workers(self._input_config) if self._input_config else []
        node = self.where.get("node_id")
        on = (f" on node {node[:12]} ({self.where.get('node_ip') or '?'})" if node
              else " before it said where it runs")
        cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
        step = self.last_checkpoint_step
        resume = (f"The newest checkpoint step of this run is step {step} (its checkpoint "
                  "closures finished); checkpoints already written are complete (cstream.save "
                  "writes atomically): resume from the newest one with cstream.load and "
                  "load_state_dict on the model, optimizer and dataloader."
                  if step is not None else
                  "No checkpoint step of this run had finished its checkpoint closures: run it "
                  "again from where it started.")
        return DriverError(
            f"the wafer driver actor died during {what}{on}: {cause}. The run cannot "
            f"continue: cstream stopped the {len(stopped)} input workers Ray still listed. "
            f"{resume}")

    def _call(self, name, *args, **kwargs):
        return self._get(getattr(self._actor(), name).remote(*args, **kwargs), name)

    def _call_async(self, name, *args):
        return Future(ref=getattr(self._actor(), name).remote(*args),
                      get=lambda r: self._get(r, name))

    def open_input(self, dataloader, cs_config, resume_states, policy):
        from workers.stream import kill_workers, start_workers_ahead

        # the input workers' processes start beside the driver's, not after it
        self._input_config = cs_config
        ahead = start_workers_ahead(cs_config)
        try:
            return self._call("open_input", dataloader, cs_config, resume_states, policy,
                              workers_ahead=ahead)
        except BaseException:
            kill_workers(ahead)  # the driver took none, or closed the streams that did
            raise

    def collect(self, since, until, indices, ack, more=0):
        # the outputs travel packed (one buffer each), unpacked here
        got = self._get(self._actor().collect_packed.remote(since, until, indices, ack, more),
                        "collect")
        got.values = _unpacked(got.values)
        return got

    def fetch(self, step, indices):
        values, stats = self._get(self._actor().fetch_packed.remote(step, indices), "fetch")
        return _unpacked(values), stats

    def close(self):
        import ray

        actor, self.actor = getattr(self, "actor", None), None
        if actor is not None and ray.is_initialized():
            if self._dead is None:  # a dead driver's call would wait for Ray to notice
                with contextlib.suppress(Exception):
                    ray.get(actor.finish.remote(wait=False), timeout=10)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
            self.started_ray = False
