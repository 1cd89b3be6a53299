"""``RateTracker``: samples per second, smoothed and overall.

>>> t = RateTracker(); t.add(10); t.add(5); t.total_count
15.0
"""

from __future__ import annotations

import time


class RateTracker:
    """Counts samples; :meth:`rate` is the smoothed rate since the previous query,
    :meth:`global_rate` the rate since the start (or the last :meth:`reset`)."""

    def __init__(self, smooth_factor: float | None = None):
        self._smooth_factor = 0.4 if smooth_factor is None else smooth_factor
        self.reset()

    def reset(self) -> None:
        self.reset_time()
        self._partial_count = 0.0
        self._partial_rate = None
        self._count = 0.0

    def reset_time(self, offset: float = 0) -> None:
        """Restart the clock ``offset`` seconds in the past."""
        self._start_time = time.perf_counter_ns() - offset * 1e9
        self._partial_time = self._start_time

    def add(self, count) -> None:
        self._count += count

    @property
    def total_count(self) -> float:
        return self._partial_count + self._count

    def rate(self) -> float:
        now = time.perf_counter_ns()
        delta = (now - self._partial_time) / 1e9
        if delta <= 0:
            return 0.0
        current = self._count / delta
        if self._partial_rate is not None:
            current = (1 - self._smooth_factor) * current + self._smooth_factor * self._partial_rate
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time = now
        self._partial_rate = current
        return current

    def global_rate(self) -> float:
        delta = self.elapsed_seconds()
        return self.total_count / delta if delta > 0 else 0.0

    def elapsed_seconds(self) -> float:
        return (time.perf_counter_ns() - self._start_time) / 1e9
