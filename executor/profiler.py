"""Throughput as the Cerebras API defines it: ``rate`` and ``global_rate``."""

from __future__ import annotations

import time

SUPPORTED_ACTIVITIES = ("rate", "global_rate")


class Profiler:
    """Samples/s of a run.

    * :meth:`rate` -- samples/s over the window since the previous ``rate()`` query, smoothed as
      ``0.6 * current + 0.4 * previous`` (the first query is unsmoothed). Each query starts a
      new window.
    * :meth:`global_rate` -- all samples processed divided by the time since the *first step
      ended*: start-up, tracing and compile time are left out, the first step's samples counted.

    ``clock`` is injectable so tests can drive time by hand.
    """

    def __init__(self, activities=None, clock=time.perf_counter):
        activities = list(SUPPORTED_ACTIVITIES if activities is None else activities)
        unknown = [a for a in activities if a not in SUPPORTED_ACTIVITIES]
        if unknown:
            raise ValueError(
                f"profiler_activities: unknown activity {unknown[0]!r}; the supported ones are "
                f"{list(SUPPORTED_ACTIVITIES)}."
            )
        self.activities = activities
        self._clock = clock
        self.total_samples = 0
        self.first_step_end = None
        self.last_step_end = None
        self._window_start = None
        self._window_samples = 0
        self._prev_rate = None
        # a separate smoothed stream for the TensorBoard writer, so logging never resets the
        # user's rate() window
        self._log_prev = None
        self._log_last_t = None
        self._log_samples = 0

    def _require(self, name):
        if name not in self.activities:
            raise RuntimeError(
                f"profiler activity {name!r} is not enabled; pass "
                f"profiler_activities=[..., {name!r}] to DataExecutor."
            )

    def step_done(self, num_samples: int, t: float | None = None) -> None:
        t = self._clock() if t is None else t
        self.total_samples += num_samples
        self.last_step_end = t
        if self.first_step_end is None:  # the first step opens the windows; its samples
            self.first_step_end = t        # were produced before them (global_rate counts them)
            self._window_start = t
            self._log_last_t = t
            return
        self._window_samples += num_samples
        self._log_samples += num_samples

    def rate(self) -> float:
        """Smoothed samples/s since the previous query (0.0 before two steps have ended)."""
        self._require("rate")
        now = self._clock()
        if self._window_start is None or now <= self._window_start:
            return 0.0 if self._prev_rate is None else self._prev_rate
        current = self._window_samples / (now - self._window_start)
        smoothed = current if self._prev_rate is None else 0.6 * current + 0.4 * self._prev_rate
        self._prev_rate = smoothed
        self._window_start = now
        self._window_samples = 0
        return smoothed

    def global_rate(self) -> float:
        """All samples / seconds since the first step ended (0.0 until time has passed)."""
        self._require("global_rate")
        if self.first_step_end is None:
            return 0.0
        elapsed = self._clock() - self.first_step_end
        return self.total_samples / elapsed if elapsed > 0 else 0.0

    def _log_rates(self):
        """(rate, global_rate) for the writer, without touching the user's windows."""
        now = self._clock()
        rate = 0.0
        if self._log_last_t is not None and now > self._log_last_t:
            cur = self._log_samples / (now - self._log_last_t)
            rate = cur if self._log_prev is None else 0.6 * cur + 0.4 * self._log_prev
            self._log_prev = rate
            self._log_last_t = now
            self._log_samples = 0
        g = 0.0
        if self.first_step_end is not None and now > self.first_step_end:
            g = self.total_samples / (now - self.first_step_end)
        return rate, g
