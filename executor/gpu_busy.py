"""Is the GPU busy? Figures from a CUDA wafer's per-step timings.

On a CUDA device the wafer records per step (:class:`executor.wafer.cuda_graph.CudaStepRunner`),
from CUDA events on the device's own clock: ``device_compute_s`` (the step's kernels, from the
event before its first to the event after its last) and ``device_idle_s`` (the device's gap
between the previous step's end and this step's start); and on the host ``input_wait_s`` (the
time the wafer waited for the step's batch). From those, over the steps given:

* ``gpu_busy_fraction`` = compute / (compute + idle): the share of the device's timeline, from
  the first step's start to the last step's end, spent in the steps;
* ``gpu_idle_waiting_for_input_s``: per step the part of its idle gap the wafer spent waiting
  for its batch (at most the gap), summed; ``gpu_input_bound_fraction`` is its share of the
  timeline. The rest of the idle time is the host's: launches, the client, Python;
* ``gpu_verdict``: busy (at least :data:`BUSY_TARGET`), or what kept it waiting.

>>> steps = [{"device_compute_s": 0.008, "device_idle_s": 0.0, "input_wait_s": 0.0},
...          {"device_compute_s": 0.008, "device_idle_s": 0.002, "input_wait_s": 0.003},
...          {"device_compute_s": 0.008, "device_idle_s": 0.0, "input_wait_s": 0.0}]
>>> f = gpu_busy(steps)
>>> round(f["gpu_busy_fraction"], 3), round(f["gpu_input_bound_fraction"], 3)
(0.923, 0.077)
>>> f["gpu_verdict"]
'the GPU waited 7.6% of its time: 7.6% for input (more input workers per CS-X), 0.0% for the host'
"""

from __future__ import annotations

import math
from typing import Optional

BUSY_TARGET = 0.95
"""A GPU busy this share of its timeline is fed: more input workers would not speed it up."""

FIGURES = ("gpu_busy_fraction", "gpu_compute_s", "gpu_idle_s", "gpu_idle_waiting_for_input_s",
           "gpu_input_bound_fraction", "gpu_timed_steps")


def has_device_timing(record: dict) -> bool:
    """Whether a step record carries the device's own timing (a CUDA wafer's)."""
    return "device_compute_s" in record and "device_idle_s" in record


def _pct(value: float) -> str:
    return f"{math.floor(1000 * value + 1e-9) / 10:.1f}%"


def gpu_busy(records: list[dict]) -> Optional[dict]:
    """The GPU-busy figures (module docstring) of the ``records`` that carry device timing;
    None when none does (a CPU wafer, an eager run)."""
    timed = [r for r in records if has_device_timing(r)]
    if not timed:
        return None
    compute = sum(float(r["device_compute_s"]) for r in timed)
    idle = sum(float(r["device_idle_s"]) for r in timed)
    for_input = sum(min(float(r["device_idle_s"]), float(r.get("input_wait_s", 0.0)))
                    for r in timed)
    span = compute + idle
    busy = compute / span if span > 0 else 1.0
    input_share = for_input / span if span > 0 else 0.0
    if busy >= BUSY_TARGET:
        verdict = f"the GPU was busy {_pct(busy)} of its time (target {_pct(BUSY_TARGET)})"
    else:
        verdict = (f"the GPU waited {_pct(1 - busy)} of its time: {_pct(input_share)} for input "
                   f"(more input workers per CS-X), {_pct(max(0.0, 1 - busy - input_share))} "
                   "for the host")
    return {"gpu_busy_fraction": busy, "gpu_compute_s": compute, "gpu_idle_s": idle,
            "gpu_idle_waiting_for_input_s": for_input, "gpu_input_bound_fraction": input_share,
            "gpu_timed_steps": len(timed), "gpu_verdict": verdict}


def busy_enough(figures: Optional[dict]) -> Optional[bool]:
    """Whether figures from :func:`gpu_busy` reach :data:`BUSY_TARGET` (None without them):
    what a sweep of workers per CS-X asks of each point on a GPU wafer."""
    if not figures:
        return None
    return figures["gpu_busy_fraction"] >= BUSY_TARGET
