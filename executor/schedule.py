"""When to checkpoint: an int (every N steps and the final step) or a Schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Union

from workers.checks import positive_int


class Schedule:
    """A set of steps, built from ranges and single steps (steps count from 1).

    >>> s = Schedule([Schedule.Range(start=10, step=10), 3])
    >>> [n for n in range(1, 35) if n in s]
    [3, 10, 20, 30]
    """

    @dataclass(frozen=True)
    class Range:
        start: int = 0
        end: Optional[int] = None
        step: int = 1
        include_last: bool = False

        def __post_init__(self):
            positive_int(self.step, "Schedule.Range.step")
            if not isinstance(self.start, int) or self.start < 0:
                raise ValueError(f"Schedule.Range.start: expected an int >= 0, got {self.start!r}")

        def contains(self, step: int, final_step: Optional[int]) -> bool:
            if step < self.start or (self.end is not None and step >= self.end):
                return bool(self.include_last and self.end is not None and step == self.end)
            return (step - self.start) % self.step == 0

    def __init__(self, ranges: Iterable[Union["Schedule.Range", int]] = ()):
        self.ranges = []
        for r in ranges:
            if isinstance(r, bool) or not isinstance(r, (int, Schedule.Range)):
                raise TypeError(
                    f"Schedule: expected Schedule.Range or int steps, got {type(r).__name__}: {r!r}"
                )
            self.ranges.append(r)

    def contains(self, step: int, final_step: Optional[int] = None) -> bool:
        for r in self.ranges:
            if isinstance(r, int):
                if r == step:
                    return True
            elif r.contains(step, final_step):
                return True
        return False

    def __contains__(self, step: int) -> bool:
        return self.contains(step)

    def __repr__(self) -> str:
        return f"Schedule({self.ranges!r})"


def normalize_checkpoint_steps(checkpoint_steps) -> Optional[Schedule]:
    if checkpoint_steps is None:
        return None
    if isinstance(checkpoint_steps, Schedule):
        return checkpoint_steps
    if isinstance(checkpoint_steps, bool) or not isinstance(checkpoint_steps, int):
        raise TypeError(
            f"checkpoint_steps: expected an int, a cstream.utils.data.Schedule or None, got "
            f"{type(checkpoint_steps).__name__}: {checkpoint_steps!r}."
        )
    positive_int(checkpoint_steps, "checkpoint_steps",
                 fix="Checkpoint every N steps with N of 1 or more, or use None for no "
                     "checkpoints.")
    return Schedule([Schedule.Range(start=checkpoint_steps, step=checkpoint_steps)])
