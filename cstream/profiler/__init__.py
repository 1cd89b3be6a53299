"""Per-op profiling of the compiled graph on a CS-X (``cerebras.pytorch.profiler``).

Cerebras flows always wrap their run in ``profile(schedule=schedule(start_step=-1,
end_step=-1))``, which profiles nothing; that works. A schedule with steps to profile asks for
the wafer's per-op trace, which cstream does not simulate: ``profile`` raises
:class:`cstream.unsupported.UnsupportedFeatureError` (cstream's own per-step profile is in the
run's directory, see docs/profiling.md).

>>> with profile(schedule=schedule(start_step=-1, end_step=-1)) as prof:
...     pass
"""

from __future__ import annotations

from dataclasses import dataclass

from cstream.unsupported import unsupported


@dataclass(frozen=True)
class _Schedule:
    start_step: int
    end_step: int

    @property
    def enabled(self) -> bool:
        return self.start_step >= 0 and self.end_step >= 0


def schedule(*, start_step: int, end_step: int) -> _Schedule:
    """Profile the steps ``start_step`` to ``end_step`` (-1, -1: none)."""
    return _Schedule(int(start_step), int(end_step))


class profile:
    """``with profile(schedule=...)``: see the module's docstring."""

    def __init__(self, schedule: _Schedule | None = None, host_activities=None,
                 on_trace_ready=None):
        if schedule is not None and schedule.enabled:
            unsupported(f"per-op profiling of steps {schedule.start_step}-{schedule.end_step} "
                        "(cerebras.pytorch.profiler.profile)")()
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.op_profiler_json = None
        """The per-op trace: None, none is taken (see the module's docstring)."""

    def get_summary(self) -> str:
        return "no per-op profile (cstream does not simulate per-op profiling)"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)
        return False


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None,
                              use_gzip: bool = False):
    """An ``on_trace_ready`` handler that writes the profile's per-op trace into ``dir_name``
    as ``<worker_name>.<time in ms>.pt.trace.json[.gz]`` for TensorBoard (``worker_name``:
    ``<hostname>_<pid>``). cstream takes no per-op trace, so it writes a file only for a
    profile that has one (``op_profiler_json`` not None)."""
    import gzip
    import json
    import os
    import socket
    import time

    def handler(prof) -> None:
        trace = getattr(prof, "op_profiler_json", None)
        if trace is None:
            return
        os.makedirs(dir_name, exist_ok=True)
        name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        path = os.path.join(dir_name, f"{name}.{int(time.time() * 1000)}.pt.trace.json")
        text = trace if isinstance(trace, str) else json.dumps(trace)
        if use_gzip:
            with gzip.open(path + ".gz", "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

    return handler
