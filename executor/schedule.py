"""When to checkpoint: a Schedule of step intervals, or an int (every N steps and the last).

Steps are 0-based iteration indices, as in the Cerebras API 2.10
(``cerebras.pytorch.utils.data.Schedule``): ``Schedule([Schedule.Range(start=2, end=8, step=3,
include_last=True)])`` matches iterations 2, 5 and 7 (the 3rd, 6th and 8th steps).

>>> s = Schedule([Schedule.Range(start=1, end=8, step=3, include_last=True)])
>>> list(s), len(s), s.match(4), s.match(5), s.final_step, s.next_immediate_step(5)
([1, 4, 7], 3, True, False, 7, 7)
>>> [i for i in range(7) if every_n_steps(3, 7).match(i)]
[2, 5, 6]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional


@dataclass
class Schedule:
    """Step intervals that do not overlap, in order (a dataclass, as the Cerebras one)."""

    @dataclass
    class Range:
        """Iterations ``start, start + step, ...`` below ``end``; with ``include_last`` also
        ``end - 1``."""

        start: int
        end: int
        step: int
        include_last: bool

        def __post_init__(self):
            if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
                raise ValueError(f"start ({self.start}) must an integer >= 0.")
            if isinstance(self.end, bool) or not isinstance(self.end, int) or self.end <= self.start:
                raise ValueError(
                    f"end ({self.end}) must be an integer greater than start {self.start}.")
            if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
                raise ValueError(f"step ({self.step}) must be an integer greater than zero.")
            if not isinstance(self.include_last, bool):
                raise ValueError(f"include_last must be a bool, got {type(self.include_last)}")

        def range(self) -> range:
            return range(self.start, self.end, self.step)

        def _last_added(self) -> bool:
            """Whether ``end - 1`` is matched only because of ``include_last``."""
            return self.include_last and (self.end - 1 - self.start) % self.step != 0

        def match(self, index: int) -> bool:
            if not self.start <= index < self.end:
                return False
            return (index - self.start) % self.step == 0 or (
                self.include_last and index == self.end - 1)

        def __iter__(self):
            yield from self.range()
            if self._last_added():
                yield self.end - 1

        def __len__(self) -> int:
            return len(self.range()) + int(self._last_added())

        @property
        def final_step(self) -> int:
            return self.end - 1 if self.include_last else self.range()[-1]

        def next_immediate_step(self, target: int) -> int:
            """The first matched iteration at or after ``target``."""
            if target > self.final_step:
                raise ValueError(
                    f"Target {target} exceeds the last interval step {self.final_step}")
            if target <= self.start:
                return self.start
            up = self.start + math.ceil((target - self.start) / self.step) * self.step
            return min(up, self.final_step)

    intervals: List["Schedule.Range"]

    def __post_init__(self):
        self.intervals = list(self.intervals)
        for interval in self.intervals:
            if not isinstance(interval, Schedule.Range):
                raise ValueError(f"interval must of type {Schedule.Range}")
        for before, after in zip(self.intervals, self.intervals[1:]):
            if after.start < before.end:
                raise ValueError(
                    f"Intervals must be non-overlapping ranges, but got {self.intervals}.")

    def match(self, index: int) -> bool:
        return any(interval.match(index) for interval in self.intervals)

    def __iter__(self):
        for interval in self.intervals:
            yield from interval

    def __len__(self) -> int:
        return sum(len(interval) for interval in self.intervals)

    def range(self) -> list:
        return [interval.range() for interval in self.intervals]

    @property
    def start(self) -> Optional[int]:
        return self.intervals[0].start if self.intervals else None

    @property
    def final_step(self) -> Optional[int]:
        return self.intervals[-1].final_step if self.intervals else None

    def next_immediate_step(self, target: int) -> Optional[int]:
        """The first matched iteration at or after ``target`` (None for an empty schedule)."""
        if not self.intervals:
            return None
        if target > self.final_step:
            raise ValueError(f"Target {target} exceeds the last interval step {self.final_step}")
        for interval in self.intervals:
            if target <= interval.final_step:
                return interval.next_immediate_step(target)
        return None


def every_n_steps(n: int, num_steps: int) -> Schedule:
    """Every ``n``-th step and the last of ``num_steps`` (none for ``n == 0``)."""
    if n == 0:
        return Schedule([])
    return Schedule([Schedule.Range(start=min(n - 1, num_steps - 1), end=num_steps, step=n,
                                    include_last=True)])


def normalize_checkpoint_steps(checkpoint_steps, num_steps: int) -> Schedule:
    """``checkpoint_steps`` of a DataExecutor (None, an int N >= 0 or a Schedule) as a
    Schedule over ``num_steps`` iterations."""
    if checkpoint_steps is None:
        return Schedule([])
    if isinstance(checkpoint_steps, Schedule):
        return checkpoint_steps
    if isinstance(checkpoint_steps, bool) or not isinstance(checkpoint_steps, int):
        raise TypeError(
            f"checkpoint_steps: expected an int, a cstream.utils.data.Schedule or None, got "
            f"{type(checkpoint_steps).__name__}: {checkpoint_steps!r}.")
    if checkpoint_steps < 0:
        raise ValueError(
            f"checkpoint_steps: expected an int >= 0 (0 for no checkpoints), got "
            f"{checkpoint_steps}.")
    return every_n_steps(checkpoint_steps, num_steps)
