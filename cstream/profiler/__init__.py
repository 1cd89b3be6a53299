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

    def __init__(self, schedule: _Schedule | None = None, host_activities=None):
        if schedule is not None and schedule.enabled:
            unsupported(f"per-op profiling of steps {schedule.start_step}-{schedule.end_step} "
                        "(cerebras.pytorch.profiler.profile)")()
        self.schedule = schedule
        self.op_profiler_json = None
        """The per-op trace: None, none is taken (see the module's docstring)."""

    def get_summary(self) -> str:
        return "no per-op profile (cstream does not simulate per-op profiling)"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
