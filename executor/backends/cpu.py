"""Eager backends: CPU (the debugging path and numerical oracle) and GPU."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from executor.backends.base import Backend, RunContext
from executor.backends.options import CPUOptions, GPUOptions
from executor.data_executor import batch_size_of
from workers.context import DataLoaderCheckpoint, WorkerInfo
from workers.resume import Source, check_position, start_position


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        moved = [_to_device(v, device) for v in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    return obj


class EagerRun:
    """A run on an eager backend: ``input_fn`` is called once as worker 0 of 1 in this process,
    and each step runs in the client as the loop body calls it."""

    has_wafer = False

    def __init__(self, backend: "CPUBackend", context: RunContext):
        self.backend = backend
        self.context = context
        dataloader = context.dataloader
        self._states: dict[int, list] = {}
        position, self._consumed = start_position(), 0
        resume_states = dataloader.resume_states
        if resume_states:
            topology = dataloader.resume_topology()
            if topology != (1, 1):
                raise ValueError(
                    f"the dataloader state was saved with num_csx={topology[0]}, "
                    f"num_workers_per_csx={topology[1]}, but the {backend.name} backend streams "
                    "as worker 0 of 1; resume it on the CSX backend with the same CSConfig."
                )
            saved = resume_states[0]
            position = check_position(dict(saved.user_state_dict or start_position()))
            self._consumed = int(saved.worker_step)
        loader = dataloader.build(WorkerInfo()) if resume_states else \
            dataloader.client_loader()
        self._source = Source(dataloader, loader, position)
        self._batch = None

    def next_batch(self, step: int):
        batch = next(self._source)
        if self.backend.device.torch_device.type != "cpu":
            batch = _to_device(batch, self.backend.device.torch_device)
        self._batch = batch
        self._consumed += 1
        if self.context.is_checkpoint_step(step):
            self._states[step] = [DataLoaderCheckpoint(
                worker_step=self._consumed, appliance_step=step + 1,
                user_state_dict=self._source.position())]
        return batch

    def worker_states(self, step: int) -> list:
        return self._states.get(step, [])

    def end_step(self, step: int) -> dict:
        return {}

    def step_done(self, step: int) -> None:
        pass

    def samples_in_step(self, step: int) -> int:
        return batch_size_of(self._batch)

    def materialize(self, obj, step: int):
        return obj  # the step ran here: its outputs are values already

    def checkpoint_reads(self, step: int):
        return contextlib.nullcontext()

    def closure_reads(self, step: int):
        return contextlib.nullcontext()

    def wafer_stats(self) -> None:
        return None

    def progress_stats(self, step: int) -> None:
        return None

    def close(self, ok: bool) -> dict:
        self._source.close()
        return {}


class CPUBackend(Backend):
    """``cstream.backend("CPU")``: eager PyTorch in one process, no Ray."""

    name = "CPU"

    def __init__(self, options: CPUOptions, mixed_precision: Optional[bool] = None):
        super().__init__(options, mixed_precision=mixed_precision)
        _ = WorkerInfo  # the client is worker 0 of 1

    def start_run(self, context: RunContext) -> EagerRun:
        return EagerRun(self, context)


class GPUBackend(CPUBackend):
    """``cstream.backend("GPU")``: eager PyTorch on a CUDA device."""

    name = "GPU"

    def __init__(self, options: GPUOptions, mixed_precision: Optional[bool] = None):
        if not torch.cuda.is_available():
            raise RuntimeError(
                'cstream.backend("GPU") needs a CUDA device, and torch.cuda.is_available() is '
                f"False here (torch {torch.__version__}). Use cstream.backend(\"CPU\") or "
                'cstream.backend("CSX") on this machine.'
            )
        Backend.__init__(self, options, torch_device=f"cuda:{options.device_index}",
                         mixed_precision=mixed_precision)

    def compile(self, model):
        model.to(self.device.torch_device)
        return super().compile(model)

    def device_context(self):
        return self.device.torch_device
