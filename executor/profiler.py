"""Throughput as the Cerebras API defines it: ``rate`` and ``global_rate``."""

from __future__ import annotations

import time

SUPPORTED_ACTIVITIES = ("rate", "global_rate")


class Profiler:
    """Samples/s of a run.

    * :meth:`rate` -- samples/s over the window since the previous ``rate()`` query, smoothed as
      ``0.6 * current + 0.4 * previous`` (the first query is unsmoothed). Each query starts a
      new window.
    * :meth:`global_rate` -- the samples of the steps after the first divided by the time since
      the *first step ended*: start-up, tracing and compile time are left out, and so is the
      first step, whose samples were produced before that clock started (0.0 until a second
      step ended).

    Once the run is over (:meth:`finish`), both read the clock as it stood when the wafer
    ended the last step: the steps the client had queued ahead of the wafer are counted until
    they ran, and the run's shutdown after them (stopping the input workers, writing the
    profile) is left out, as Cerebras's rate tracker keeps the figures it computed at the last
    step until another step adds samples.

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
        self.samples = 0
        self.started = clock()
        self.first_step_end = None
        self.last_step_end = None
        self._window_start = None
        self._window_samples = 0
        self._prev_rate = None
        self._first_samples = 0
        self._finished_at = None

    def _require(self, name):
        if name not in self.activities:
            raise RuntimeError(
                f"profiler activity {name!r} is not enabled; pass "
                f"profiler_activities=[..., {name!r}] to DataExecutor."
            )

    def step_done(self, num_samples: int, t: float | None = None) -> None:
        t = self._clock() if t is None else t
        self.samples += num_samples
        self.last_step_end = t
        if self.first_step_end is None:  # the first step opens the windows; its samples
            self.first_step_end = t        # were produced before them
            self._first_samples = num_samples
            self._window_start = t
            return
        self._window_samples += num_samples

    def finish(self, last_step_ran: float | None = None) -> None:
        """The run is over: from now on the figures are read at ``last_step_ran`` (this clock's
        time when the wafer ended the last step), or, where that is unknown or earlier, when
        the client ended it (at this call where no step ended). Only the first call counts."""
        if self._finished_at is not None:
            return
        ends = [t for t in (last_step_ran, self.last_step_end) if t is not None]
        self._finished_at = max(ends) if ends else self._clock()

    def _now(self) -> float:
        return self._clock() if self._finished_at is None else self._finished_at

    def rate(self) -> float:
        """Smoothed samples/s since the previous query (0.0 before two steps have ended)."""
        self._require("rate")
        now = self._now()
        if self._window_start is None or now <= self._window_start:
            return 0.0 if self._prev_rate is None else self._prev_rate
        current = self._window_samples / (now - self._window_start)
        smoothed = current if self._prev_rate is None else 0.6 * current + 0.4 * self._prev_rate
        self._prev_rate = smoothed
        self._window_start = now
        self._window_samples = 0
        return smoothed

    def global_rate(self) -> float:
        """Samples of the steps after the first / seconds since the first step ended."""
        self._require("global_rate")
        return self._global_rate(self._now())

    def global_rate_at_end(self) -> float:
        """:meth:`global_rate` at the end of the last step (0.0 before two steps ended); once
        the run is over, at the wafer's end of it."""
        end = self._finished_at if self._finished_at is not None else self.last_step_end
        return 0.0 if end is None else self._global_rate(end)

    def _global_rate(self, now: float) -> float:
        if self.first_step_end is None or now <= self.first_step_end:
            return 0.0
        return (self.samples - self._first_samples) / (now - self.first_step_end)

    def total_samples(self) -> int:
        """Samples of all the steps that have ended."""
        return self.samples

    def total_time(self) -> float:
        """Seconds from the executor's creation to the end of the last step (to now before;
        once the run is over, to the wafer's end of it)."""
        end = self._finished_at if self._finished_at is not None else \
            self.last_step_end if self.last_step_end is not None else self._clock()
        return end - self.started

    @property
    def rate_tracker(self) -> "RateTrackerView":
        """The Release 2.2 API's view of these figures (``executor.profiler.rate_tracker.rate``
        and so on, properties instead of calls)."""
        return RateTrackerView(self)


def _figure(name: str) -> property:
    """A property reading the view's profiler's figure ``name`` (a method of :class:`Profiler`)."""
    return property(lambda view: getattr(view._profiler, name)(),
                    doc=f":meth:`Profiler.{name}`, as a property.")


class RateTrackerView:
    """``profiler.rate_tracker``: :class:`Profiler`'s figures as properties."""

    def __init__(self, profiler: Profiler):
        self._profiler = profiler

    total_samples = _figure("total_samples")
    total_time = _figure("total_time")
    rate = _figure("rate")
    global_rate = _figure("global_rate")
    samples_per_sec = global_rate

