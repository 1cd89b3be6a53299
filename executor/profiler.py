"""Throughput as the Cerebras API defines it: ``rate`` and ``global_rate``."""

from __future__ import annotations

import time
from typing import Callable, Optional

SUPPORTED_ACTIVITIES = ("rate", "global_rate")

WaferEnds = Callable[[int, int], Optional[tuple[int, float]]]
"""``(step, after)`` -> the newest step in ``(after, step]`` the wafer is known to have ended
and when, or None (see :meth:`Profiler.time_steps_by`)."""


class Profiler:
    """Samples/s of a run.

    * :meth:`rate` -- samples/s over the window since the previous ``rate()`` query, smoothed as
      ``0.6 * current + 0.4 * previous`` (the first query is unsmoothed). Each query starts a
      new window.
    * :meth:`global_rate` -- the samples of the steps after the first divided by the time since
      the *first step ended*: start-up, tracing and compile time are left out, and so is the
      first step, whose samples were produced before that clock started (0.0 until a second
      step ended).

    A step's samples count from the end of its step on the client (:meth:`step_done`, before
    its step closures run, as Cerebras's client counts them). Where the wafer's end of a step
    is known (``time_steps_by``: its figures came back with the step's outputs), the figures are
    timed by the wafer's step ends: read at the newest counted step the wafer is known to have
    ended, with the samples up to it. One call brings the outputs of several steps and their
    closures then run back to back, so the client's clock would time the client's burst, not
    the wafer's pace. Where no wafer end is known since the last query (an eager run; a loop
    whose closures read no output), they are read at the client's clock with every counted
    step's samples.

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
        self.started = clock()
        self.first_step_end = None
        """The client's clock when it counted the first step."""
        self.last_step_end = None
        """The client's clock when it counted the newest step."""
        self._through: list[int] = []  # samples of steps 1..k, at index k - 1
        self._wafer_ends: Optional[WaferEnds] = None
        self._first_wafer_end = None
        # the previous rate() query's window end: (steps counted in it, time)
        self._window: Optional[tuple[int, float]] = None
        self._prev_rate = None
        self._finished_at = None

    def time_steps_by(self, wafer_ends: Optional[WaferEnds]) -> None:
        """Time steps by ``wafer_ends(step, after)``: the newest step in ``(after, step]``
        (counted from 1) the wafer is known to have ended, and when, on this clock; None where
        it knows of none. None: by the client's clock alone."""
        self._wafer_ends = wafer_ends

    @property
    def samples(self) -> int:
        """Samples of the steps counted so far."""
        return self._through[-1] if self._through else 0

    def _require(self, name):
        if name not in self.activities:
            raise RuntimeError(
                f"profiler activity {name!r} is not enabled; pass "
                f"profiler_activities=[..., {name!r}] to DataExecutor."
            )

    def step_done(self, num_samples: int) -> None:
        """The client counted a step of ``num_samples`` samples."""
        t = self._clock()
        self._through.append(self.samples + num_samples)
        self.last_step_end = t
        if self.first_step_end is None:
            self.first_step_end = t

    def finish(self, last_step_ran: float | None = None) -> None:
        """The run is over: from now on the figures are read at ``last_step_ran`` (this clock's
        time when the wafer ended the last step), or, where that is unknown, when the client
        counted it (at this call where no step ended). Only the first call counts."""
        if self._finished_at is not None:
            return
        self._first_start()  # resolved while the wafer's figures are at hand
        self._finished_at = last_step_ran if last_step_ran is not None else \
            self.last_step_end if self.last_step_end is not None else self._clock()
        self._wafer_ends = None

    def _first_start(self) -> Optional[float]:
        """When the first step ended: on the wafer where known, else on the client."""
        if self._first_wafer_end is None and self._wafer_ends is not None and self._through:
            first = self._wafer_ends(1, 0)
            self._first_wafer_end = None if first is None else first[1]
        return self._first_wafer_end if self._first_wafer_end is not None \
            else self.first_step_end

    def _reading(self, after: int) -> tuple[int, float]:
        """(steps counted, time) the figures are read at: the newest counted step after step
        ``after`` whose wafer end is known, and that end; else every counted step and the
        client's clock now (once the run is over: at its end)."""
        if self._finished_at is not None:
            return len(self._through), self._finished_at
        if self._wafer_ends is not None:
            known = self._wafer_ends(len(self._through), after)
            if known is not None:
                return known
        return len(self._through), self._clock()

    def _samples_through(self, steps: int) -> int:
        return self._through[steps - 1] if steps > 0 else 0

    def rate(self) -> float:
        """Smoothed samples/s since the previous query (0.0 before two steps have ended)."""
        self._require("rate")
        if not self._through:
            return 0.0
        if self._window is None:
            self._window = (1, self._first_start())
        after, start = self._window
        steps, now = self._reading(after)
        if steps <= after or now <= start:
            return 0.0 if self._prev_rate is None else self._prev_rate
        current = (self._samples_through(steps) - self._samples_through(after)) / (now - start)
        smoothed = current if self._prev_rate is None else 0.6 * current + 0.4 * self._prev_rate
        self._prev_rate = smoothed
        self._window = (steps, now)
        return smoothed

    def global_rate(self) -> float:
        """Samples of the steps after the first / seconds since the first step ended."""
        self._require("global_rate")
        if not self._through:
            return 0.0
        steps, now = self._reading(1)
        return self._global_rate(steps, now)

    def global_rate_at_end(self) -> float:
        """:meth:`global_rate` at the end of the last step (0.0 before two steps ended); once
        the run is over, at the wafer's end of it."""
        if not self._through:
            return 0.0
        end = self._finished_at if self._finished_at is not None else self.last_step_end
        return self._global_rate(len(self._through), end)

    def _global_rate(self, steps: int, now: float) -> float:
        first = self._first_start()
        if steps < 2 or now <= first:
            return 0.0
        return (self._samples_through(steps) - self._samples_through(1)) / (now - first)

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

