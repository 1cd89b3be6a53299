"""``benchmark_dataloader``: how fast a dataloader produces batches, epoch by epoch, and which
batch structures (tensor shapes and dtypes) it produces, with where each first occurs.

>>> import torch
>>> m = benchmark_dataloader(lambda: [torch.zeros(4, 2)] * 3, num_epochs=2, print_metrics=False)
>>> m.total_steps, [e.total_steps for e in m.epoch_metrics], len(m.batch_specs), m.is_partial
(6, [3, 3], 1, False)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

from workers.torch_compat import tree_flatten

logger = logging.getLogger("cerebras.benchmark")


@dataclass(frozen=True)
class TensorSpec:
    shape: torch.Size
    dtype: torch.dtype

    @staticmethod
    def from_tensor(tensor) -> "TensorSpec":
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"DataLoader returned a non-tensor of type `{type(tensor)}` and "
                            f"value: {tensor}")
        return TensorSpec(tensor.shape, tensor.dtype)

    def __str__(self):
        return f"TensorSpec(shape={tuple(self.shape)}, dtype={self.dtype})"


@dataclass(frozen=True)
class BatchSpec:
    """A batch's structure: its tensors' specs in flattened order and the tree around them."""

    tensors: tuple
    spec: Any

    @staticmethod
    def from_batch(batch) -> "BatchSpec":
        leaves, spec = tree_flatten(batch)
        return BatchSpec(tuple(TensorSpec.from_tensor(t) for t in leaves), spec)

    def __hash__(self):
        return hash((self.tensors, str(self.spec)))


@dataclass
class BatchSpecOccurence:
    epoch_step: int
    epoch: int
    count: int


@dataclass
class BatchMetrics:
    epoch_step: int
    global_step: int
    local_rate: float
    global_rate: float
    profile_activities: Dict[str, Any] = field(default_factory=dict)
    sampling_time_ns: int = field(default_factory=time.time_ns)


@dataclass
class EpochMetrics:
    iterator_creation: timedelta = field(default_factory=lambda: timedelta(0))
    iteration_time: timedelta = field(default_factory=lambda: timedelta(0))
    total_steps: int = 0
    batch_metrics: List[BatchMetrics] = field(default_factory=list)
    start_time_ns: int = field(default_factory=time.time_ns)
    end_time_ns: int = 0

    @property
    def total_time(self) -> timedelta:
        return self.iterator_creation + self.iteration_time


@dataclass
class Metrics:
    dataloader_build_time: timedelta = field(default_factory=lambda: timedelta(0))
    epoch_metrics: List[EpochMetrics] = field(default_factory=list)
    batch_specs: Dict[BatchSpec, BatchSpecOccurence] = field(default_factory=dict)
    total_time: timedelta = field(default_factory=lambda: timedelta(0))
    global_rate: float = 0.0
    is_partial: bool = True
    start_time_ns: int = field(default_factory=time.time_ns)
    end_time_ns: int = 0

    @property
    def total_steps(self) -> int:
        return sum(e.total_steps for e in self.epoch_metrics)

    @property
    def global_sample_rate(self) -> Optional[float]:
        """Samples/s, where every batch has one structure whose tensors share dimension 0."""
        if len(self.batch_specs) != 1:
            return None
        tensors = next(iter(self.batch_specs)).tensors
        if not tensors or not tensors[0].shape:
            return None
        size = tensors[0].shape[0]
        if any(not t.shape or t.shape[0] != size for t in tensors[1:]):
            return None
        return self.global_rate * size


class _Clock:
    def __init__(self):
        self.start = time.perf_counter()
        self.steps = 0

    def elapsed(self) -> timedelta:
        return timedelta(seconds=time.perf_counter() - self.start)

    def rate(self) -> float:
        seconds = time.perf_counter() - self.start
        return self.steps / seconds if seconds > 0 else 0.0


def benchmark_dataloader(input_fn: Callable[..., Iterable], num_epochs: Optional[int] = None,
                         steps_per_epoch: Optional[int] = None,
                         sampling_frequency: Optional[int] = None,
                         profile_activities: Optional[List[str]] = None,
                         print_metrics: bool = True) -> Metrics:
    """Build the dataloader with ``input_fn()`` and iterate it ``num_epochs`` times (1 when
    None), each time for at most ``steps_per_epoch`` batches (all when None), sampling the rates
    at the first step and every ``sampling_frequency`` steps (100 when None, 0 for the first
    only). ``profile_activities`` (the Cerebras package's per-batch CPU and memory probes) must
    be empty here: cstream has none. ``print_metrics`` logs a summary."""
    num_epochs = 1 if num_epochs is None else num_epochs
    if num_epochs <= 0:
        raise ValueError(f"num_epochs must be positive, but got {num_epochs}.")
    sampling_frequency = 100 if sampling_frequency is None else sampling_frequency
    if sampling_frequency < 0:
        raise ValueError(f"sampling_frequency must be non-negative, but got {sampling_frequency}.")
    if steps_per_epoch is not None and steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be positive, but got {steps_per_epoch}.")
    if profile_activities is not None and not isinstance(profile_activities, (list, tuple, set)):
        raise TypeError(f"Invalid profile_activities type: {type(profile_activities)}. Expected "
                        f"a list, tuple, or set.")
    for activity in profile_activities or ():
        raise ValueError(f"Invalid profile activity: {activity}. Available profiling activities "
                         f"are: []. (cstream has no per-batch profilers: leave profile_activities "
                         f"unset.)")
    metrics = Metrics()
    global_clock = _Clock()
    try:
        dataloader = input_fn()
    except Exception as e:
        raise RuntimeError("Failed to create the dataloader.") from e
    metrics.dataloader_build_time = global_clock.elapsed()
    global_clock = _Clock()
    global_step = 0
    for epoch in range(1, num_epochs + 1):
        em = EpochMetrics()
        metrics.epoch_metrics.append(em)
        clock = _Clock()
        try:
            iterator = iter(dataloader)
        except Exception as e:
            raise RuntimeError(f"Failed to create dataloader iterator at epoch {epoch}.") from e
        em.iterator_creation = clock.elapsed()
        clock = _Clock()
        epoch_step = 0
        while steps_per_epoch is None or epoch_step < steps_per_epoch:
            try:
                batch = next(iterator)
            except StopIteration:
                if epoch_step == 0:
                    raise RuntimeError(f"Dataloader returned no batches at epoch {epoch}.") from None
                break
            except Exception as e:
                raise RuntimeError(f"Dataloader ran into error when generating batch at epoch "
                                   f"step {epoch_step + 1}, global step {global_step + 1}.") from e
            epoch_step += 1
            global_step += 1
            clock.steps += 1
            global_clock.steps += 1
            if epoch_step == 1 or (sampling_frequency > 0 and epoch_step % sampling_frequency == 0):
                em.batch_metrics.append(BatchMetrics(epoch_step, global_step, clock.rate(),
                                                     global_clock.rate()))
            spec = BatchSpec.from_batch(batch)
            if spec in metrics.batch_specs:
                metrics.batch_specs[spec].count += 1
            else:
                metrics.batch_specs[spec] = BatchSpecOccurence(epoch_step, epoch, 1)
        em.total_steps = epoch_step
        em.iteration_time = clock.elapsed()
        em.end_time_ns = time.time_ns()
    metrics.total_time = global_clock.elapsed()
    metrics.global_rate = global_clock.rate()
    metrics.is_partial = False
    metrics.end_time_ns = time.time_ns()
    if print_metrics:
        logger.info(f"{metrics.total_steps} batches in {num_epochs} epoch(s), "
                    f"{metrics.global_rate:.2f} steps/s, {len(metrics.batch_specs)} batch "
                    f"structure(s); dataloader built in {metrics.dataloader_build_time}.")
    return metrics
