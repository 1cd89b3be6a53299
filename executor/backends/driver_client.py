"""Talking to the wafer driver: one typed interface, in-process or to a Ray actor.

:class:`DriverClient` names every call the client makes. :class:`LocalDriverClient` calls the
driver in this process; :class:`RayDriverClient` sends the same calls to the driver actor. The
Ray actor (and Ray itself, when embedded) is started in a background thread as soon as the
backend exists, so Ray's start-up overlaps the user building the model; the first call waits
for it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from typing import Optional

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


class DriverClient:
    """The calls the client makes to the wafer driver (see :class:`WaferDriver`)."""

    startup: dict
    last_checkpoint_step: Optional[int] = None
    """The newest step (counted from 1) whose checkpoint closures finished in the client."""

    @staticmethod
    def create(backend) -> "DriverClient":
        if backend.options.in_process:
            return LocalDriverClient(backend)
        return RayDriverClient(backend)

    def put_state(self, items: dict) -> int: ...
    def get_state(self, keys: list) -> dict: ...
    def load_program(self, graph, state_order, consts, batch_metas, state_metas=None,
                     compile_only=False, num_steps=None,
                     matmul_flops_per_step=None, graph_code=None, retrace=False) -> dict: ...
    def open_input(self, dataloader, cs_config, resume_states, policy): ...
    def start(self, num_steps: int, checkpoint_steps: list) -> None: ...
    def collect(self, since: int, until: int, indices: list, ack: int,
                more: int = 0) -> Collected: ...
    def fetch(self, step: int, indices: list) -> tuple: ...
    def wait_done(self, step: int) -> int: ...
    def ack_async(self, step: int) -> Future: ...
    def snapshot(self, step: int, keys: list) -> dict: ...
    def set_rng_state(self, state) -> None: ...
    def input_checks(self) -> dict: ...
    def feed_consts_async(self, step: int, values) -> Future: ...
    def worker_states(self, step: int) -> list: ...
    def autoscale_state(self, step: int) -> Optional[dict]: ...
    def finish(self, wait: bool) -> dict: ...
    def describe(self) -> dict: ...

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

    def put_state(self, items):
        return self.driver.put_state(items)

    def get_state(self, keys):
        return self.driver.get_state(keys)

    def load_program(self, *args, **kwargs):
        return self.driver.load_program(*args, **kwargs)

    def open_input(self, dataloader, cs_config, resume_states, policy):
        return self.driver.open_input(dataloader, cs_config, resume_states, policy)

    def start(self, num_steps, checkpoint_steps):
        return self.driver.start(num_steps, checkpoint_steps)

    def collect(self, since, until, indices, ack, more=0):
        return self.driver.collect(since, until, indices, ack, more)

    def fetch(self, step, indices):
        return self.driver.fetch(step, indices)

    def wait_done(self, step):
        return self.driver.wait_done(step)

    def ack_async(self, step):
        try:
            return Future(self.driver.ack(step))
        except Exception as e:  # surfaced when the result is read
            return Future(error=e)

    def snapshot(self, step, keys):
        return self.driver.snapshot(step, keys)

    def set_rng_state(self, state):
        return self.driver.set_rng_state(state)

    def input_checks(self):
        return self.driver.input_checks()

    def feed_consts_async(self, step, values):
        try:
            return Future(self.driver.feed_consts(step, values))
        except Exception as e:  # surfaced when the result is read
            return Future(error=e)

    def worker_states(self, step):
        return self.driver.worker_states(step)

    def autoscale_state(self, step):
        return self.driver.autoscale_state(step)

    def finish(self, wait):
        return self.driver.finish(wait=wait)

    def describe(self):
        return self.driver.describe()

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

    def put_state(self, items):
        return self._get(self._actor().put_state.remote(items), "put_state")

    def get_state(self, keys):
        return self._get(self._actor().get_state.remote(keys), "get_state")

    def load_program(self, *args, **kwargs):
        return self._get(self._actor().load_program.remote(*args, **kwargs), "load_program")

    def open_input(self, dataloader, cs_config, resume_states, policy):
        from workers.stream import kill_workers, start_workers_ahead

        # the input workers' processes start beside the driver's, not after it
        self._input_config = cs_config
        ahead = start_workers_ahead(cs_config)
        try:
            return self._get(self._actor().open_input.remote(
                dataloader, cs_config, resume_states, policy, workers_ahead=ahead), "open_input")
        except BaseException:
            kill_workers(ahead)  # the driver took none, or closed the streams that did
            raise

    def start(self, num_steps, checkpoint_steps):
        return self._get(self._actor().start.remote(num_steps, checkpoint_steps), "start")

    def collect(self, since, until, indices, ack, more=0):
        got = self._get(self._actor().collect_packed.remote(since, until, indices, ack, more),
                        "collect")
        got.values = _unpacked(got.values)
        return got

    def fetch(self, step, indices):
        values, stats = self._get(self._actor().fetch_packed.remote(step, indices), "fetch")
        return _unpacked(values), stats

    def wait_done(self, step):
        return self._get(self._actor().wait_done.remote(step), "wait_done")

    def ack_async(self, step):
        return Future(ref=self._actor().ack.remote(step), get=lambda r: self._get(r, "ack"))

    def snapshot(self, step, keys):
        return self._get(self._actor().snapshot.remote(step, keys), "snapshot")

    def set_rng_state(self, state):
        return self._get(self._actor().set_rng_state.remote(state), "set_rng_state")

    def input_checks(self):
        return self._get(self._actor().input_checks.remote(), "input_checks")

    def feed_consts_async(self, step, values):
        return Future(ref=self._actor().feed_consts.remote(step, values),
                      get=lambda r: self._get(r, "feed_consts"))

    def worker_states(self, step):
        return self._get(self._actor().worker_states.remote(step), "worker_states")

    def autoscale_state(self, step):
        return self._get(self._actor().autoscale_state.remote(step), "autoscale_state")

    def finish(self, wait):
        return self._get(self._actor().finish.remote(wait=wait), "finish")

    def describe(self):
        return self._get(self._actor().describe.remote(), "describe")

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
