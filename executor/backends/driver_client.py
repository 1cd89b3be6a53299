"""Talking to the wafer driver: the same calls in-process or to a Ray actor."""

from __future__ import annotations

import atexit
import contextlib
import os

from executor.driver import DriverError, WaferDriver
from executor.phases import phase


class _Done:
    def __init__(self, value=None, error=None):
        self._value, self._error = value, error

    def ready(self) -> bool:
        return True

    def result(self):
        if self._error is not None:
            raise self._error
        return self._value


class DriverClient:
    """``call(method, *args)`` blocks for the result; ``call_async`` returns a future."""

    @staticmethod
    def create(backend) -> "DriverClient":
        if backend.in_process:
            return LocalDriverClient(WaferDriver(
                device=backend.exec_device, compile_dir=str(backend.compile_dir),
                compiler=backend.compiler, use_ray_workers=False))
        return RayDriverClient(backend)

    def call(self, method: str, *args, **kwargs):
        raise NotImplementedError

    def call_async(self, method: str, *args, **kwargs):
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalDriverClient(DriverClient):
    def __init__(self, driver: WaferDriver):
        self.driver = driver

    def call(self, method, *args, **kwargs):
        return getattr(self.driver, method)(*args, **kwargs)

    def call_async(self, method, *args, **kwargs):
        try:
            return _Done(self.call(method, *args, **kwargs))
        except Exception as e:  # surfaced when the result is read
            return _Done(error=e)

    def close(self):
        with contextlib.suppress(Exception):
            self.driver.finish(wait=False)


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


class _RayFuture:
    def __init__(self, ref):
        self.ref = ref

    def ready(self) -> bool:
        import ray

        done, _ = ray.wait([self.ref], timeout=0)
        return bool(done)

    def result(self):
        return _ray_get(self.ref)


class RayDriverClient(DriverClient):
    """The driver as a Ray actor. Ray is started here (embedded, loopback) unless it runs."""

    def __init__(self, backend):
        import ray

        from executor.ray_session import ensure_ray

        self.started_ray = ensure_ray(address=backend.address)
        options = dict(max_concurrency=16, num_cpus=0, name=f"cstream-wafer-{os.getpid()}-"
                       f"{id(backend):x}")
        if str(backend.exec_device).startswith("cuda"):
            options["num_gpus"] = 1
        actor_cls = ray.remote(WaferDriver)
        with phase("starting the wafer driver"):
            self.actor = actor_cls.options(**options).remote(
                device=backend.exec_device, compile_dir=str(backend.compile_dir),
                compiler=backend.compiler, use_ray_workers=True)
            ray.get(self.actor.ping.remote())
        atexit.register(self.close)

    def call(self, method, *args, **kwargs):
        import ray

        if self.actor is None:
            raise DriverError("the wafer driver was shut down with its backend; create a new "
                              "backend with cstream.backend(...).")
        try:
            return _ray_get(getattr(self.actor, method).remote(*args, **kwargs))
        except ray.exceptions.RayActorError as e:
            raise DriverError(
                f"the wafer driver actor died during {method}(): {e}. The run cannot continue. "
                "Checkpoints already written are complete (cstream.save writes atomically): "
                "resume from the newest one with cstream.load and load_state_dict on the model, "
                "optimizer and dataloader."
            ) from e

    def call_async(self, method, *args, **kwargs):
        return _RayFuture(getattr(self.actor, method).remote(*args, **kwargs))

    def close(self):
        import ray

        actor, self.actor = getattr(self, "actor", None), None
        if actor is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.get(actor.finish.remote(wait=False), timeout=10)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
            self.started_ray = False
