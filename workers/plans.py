"""How a stream's assignment is chosen: an :class:`AssignmentPlan` says how the workers start
(:meth:`AssignmentPlan.spawn_options`) and, once they have, chooses the
:class:`~workers.assignment.Assignment` -- :class:`RoundRobinPlan` round-robin whatever the
configuration asks, :class:`ConfiguredPlan` what ``CSConfig.input_assignment`` asks (dynamic
where every worker's loader can take part, :func:`workers.loaders.dynamic_assignment_support`,
else round-robin). The stream asks the chosen assignment alone from then on."""

from __future__ import annotations

from typing import Protocol

import ray

from workers.assignment import Assignment, AssignmentRecorder, RoundRobin, StreamParts
from workers.config import CSConfig
from workers.coordinator import DynamicAssignment
from workers.resume import ResumeStates

__all__ = ["AssignmentPlan", "ConfiguredPlan", "RoundRobinPlan"]


class AssignmentPlan(Protocol):
    def spawn_options(self, first: bool) -> dict:
        """More :class:`~workers.input_worker.InputWorker` arguments for a worker's process
        (``first``: one of the stream's first processes, neither a restarted one nor one of a
        worker added while the stream runs)."""

    def choose(self, parts: StreamParts) -> Assignment:
        """The assignment, once the workers have started."""


class RoundRobinPlan:
    """Round-robin whatever the configuration asks."""

    def spawn_options(self, first: bool) -> dict:
        return {}

    def choose(self, parts: StreamParts) -> Assignment:
        W = len(parts.links)
        return RoundRobin(parts, AssignmentRecorder(W, "static", "the stream assigns round-robin"))


class ConfiguredPlan:
    """``CSConfig.input_assignment``: ``"static"`` is round-robin; ``"dynamic"`` starts every
    worker ready for numbers and, if their loaders all take part, a
    :class:`~workers.coordinator.DynamicAssignment` (every worker resuming from the furthest
    position among ``resume_states``, :meth:`workers.resume.ResumeStates.global_position`),
    else round-robin, saying why."""

    def __init__(self, cs_config: CSConfig, resume_states=None):
        self.requested = cs_config.input_assignment
        self.dynamic = self.requested == "dynamic"
        self.dynamic_start = None
        if resume_states is not None and self.dynamic:
            self.dynamic_start = ResumeStates(resume_states).global_position()

    def spawn_options(self, first: bool) -> dict:
        if not self.dynamic:
            return {}
        start = self.dynamic_start if first else None
        return {"dynamic": True, "dynamic_start": None if start is None else start.loader}

    def choose(self, parts: StreamParts) -> Assignment:
        W = len(parts.links)
        if not self.dynamic:
            return RoundRobin(parts, AssignmentRecorder(
                W, self.requested, "CSConfig.input_assignment='static'"))
        modes, ahead = [], []
        for link in parts.links:
            try:
                mode, why, drawn = ray.get(link.actor.assignment_mode.remote())
            except ray.exceptions.RayError:
                mode, why, drawn = "failed", "", 0  # fetch reports what went wrong
            modes.append((mode, why))
            ahead.append(drawn)
        kinds = {m for m, _ in modes if m != "failed"}
        if kinds == {"dynamic"}:
            return DynamicAssignment(parts, AssignmentRecorder(W, self.requested, modes[0][1]),
                                     ahead, self.dynamic_start)
        if "dynamic" in kinds:  # the stream closes itself as it raises
            raise RuntimeError(
                f"CS-X {parts.wse_id}: the input workers' loaders disagree on dynamic "
                f"assignment ({[m for m, _ in modes]}); input_fn must build the same kind "
                "of loader in every worker.")
        # a failed build is reported by the first fetch; round-robin then raises it
        reason = next((why for m, why in modes if m == "static"),
                      "the input workers could not build their dataloaders")
        return RoundRobin(parts, AssignmentRecorder(W, self.requested, reason))
