"""Eager backends: CPU (the debugging path and numerical oracle) and GPU.

Both are one :class:`EagerBackend` on a torch device: the model, every state tensor cstream
creates (optimizer state, schedulers, loss scaler, metrics), the batches and the random stream
of the step live on that device, and step closures get their tensors on the CPU.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from executor.backends.base import Backend, RunContext
from executor.backends.options import CPUOptions, GPUOptions
from executor.data_executor import batch_size_of
from executor.wafer.heap import keep_freed_memory_here
from workers.aggregates import run_resume_states
from workers.context import DataLoaderCheckpoint, WorkerInfo
from workers.resume import Source, check_position, start_position


def _to_device(obj, device, only_from=None):
    """``obj`` with every tensor moved to ``device`` (only those on ``only_from``, if given);
    dicts, lists, tuples and namedtuples keep their types. A CPU tensor bound for a CUDA
    device goes through pinned memory (torch's caching host allocator reuses the buffers), so
    the copy is asynchronous: the host does not wait for the device, as with a DataLoader's
    ``pin_memory=True`` and ``non_blocking=True``."""
    if isinstance(obj, torch.Tensor):
        if only_from is not None and obj.device != only_from:
            return obj
        if obj.device.type == "cpu" and torch.device(device).type == "cuda":
            pinned = obj if obj.is_pinned() else obj.pin_memory()
            return pinned.to(device, non_blocking=True)
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device, only_from)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        moved = [_to_device(v, device, only_from) for v in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    return obj


class EagerRun:
    """A run on an eager backend: ``input_fn`` is called once as worker 0 of 1 in this process,
    and each step runs in the client as the loop body calls it."""

    has_wafer = False

    def __init__(self, backend: "EagerBackend", context: RunContext):
        self.backend = backend
        self.context = context
        dataloader = context.dataloader
        self._states: dict[int, list] = {}
        position, self._consumed = start_position(), 0
        resume_states = run_resume_states(dataloader, 1, 1)
        if resume_states:
            topology = dataloader.resume_topology() or (1, 1)
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

    def autoscale_state(self, step: int) -> None:
        return None  # one input worker, in this process: nothing to scale

    def end_step(self, step: int) -> dict:
        return {}

    def step_done(self, step: int) -> None:
        pass

    def samples_in_step(self, step: int) -> int:
        return batch_size_of(self._batch)

    def materialize(self, obj, step: int):
        # the step ran here: its outputs are values already. Off the CPU, a closure gets them on
        # the CPU, as on the CPU backend (one copy per tensor: a sync point with the device)
        device = self.backend.device.torch_device
        if device.type == "cpu":
            return obj
        return _to_device(obj, "cpu", only_from=device)

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
        return {"heap": self.backend.heap}


class EagerBackend(Backend):
    """Eager PyTorch in this process, on ``torch_device``: the model is moved there at
    :meth:`compile`, tensors created under ``with backend.device:`` and the state tensors of
    cstream's objects are created there, batches are moved there, and the random stream of the
    step is that device's generator."""

    def __init__(self, options, torch_device: str = "cpu", mixed_precision: Optional[bool] = None):
        self.name = options.backend_name
        super().__init__(options, torch_device=torch_device, mixed_precision=mixed_precision)
        self.heap = keep_freed_memory_here()  # the step runs in this process

    def compile(self, model):
        if self.device.torch_device.type != "cpu":
            model.to(self.device.torch_device)
            self._optimizer_state_to_device()
        return super().compile(model)

    def _optimizer_state_to_device(self) -> None:
        """State an optimizer created before the model moved (built, or loaded from a
        checkpoint, before ``cstream.compile``) follows it to the device."""
        device = self.device.torch_device
        for optimizer in list(self._stateful):
            for state in getattr(optimizer, "state", {}).values():
                for name, value in state.items():
                    if isinstance(value, torch.Tensor) and value.device != device:
                        state[name] = value.to(device)

    def device_context(self):
        if self.device.torch_device.type == "cpu":
            return contextlib.nullcontext()
        return self.device.torch_device

    def state_tensor(self, tensor, readable=False):
        return tensor.to(self.device.torch_device)

    def start_run(self, context: RunContext) -> EagerRun:
        return EagerRun(self, context)

    # -- randomness: the generator the step's random ops draw from -----------------------------
    def _cuda(self) -> bool:
        return self.device.torch_device.type == "cuda"

    def get_rng_state(self) -> torch.Tensor:
        if self._cuda():
            return torch.cuda.get_rng_state(self.device.torch_device)
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        expected = self.get_rng_state().numel()
        if state.numel() != expected:
            where = f"the {self.device.torch_device} generator" if self._cuda() else \
                "the CPU generator"
            raise ValueError(
                f"cstream.set_rng_state: the state has {state.numel()} bytes, but {where} of the "
                f"{self.name} backend keeps {expected}: it was saved from another device's "
                "generator (a CUDA generator's state differs from a CPU one's). Restore it on "
                "a backend of the device it was saved on, or seed this one with "
                "cstream.manual_seed.")
        if self._cuda():
            torch.cuda.set_rng_state(state, self.device.torch_device)
        else:
            torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds the CPU generator and every CUDA device's


class CPUBackend(EagerBackend):
    """``cstream.backend("CPU")``: eager PyTorch in one process, no Ray; the client is
    worker 0 of 1."""

    def __init__(self, options: CPUOptions, mixed_precision: Optional[bool] = None):
        super().__init__(options, mixed_precision=mixed_precision)


class GPUBackend(EagerBackend):
    """``cstream.backend("GPU")``: eager PyTorch on a CUDA device."""

    def __init__(self, options: GPUOptions, mixed_precision: Optional[bool] = None):
        if not torch.cuda.is_available():
            raise RuntimeError(
                'cstream.backend("GPU") needs a CUDA device, and torch.cuda.is_available() is '
                f"False here (torch {torch.__version__}). Use cstream.backend(\"CPU\") or "
                'cstream.backend("CSX") on this machine.'
            )
        if options.device_index >= torch.cuda.device_count():
            raise ValueError(
                f'cstream.backend("GPU", device_index={options.device_index}): this machine has '
                f"{torch.cuda.device_count()} CUDA device(s), numbered from 0. Set device_index "
                "to one of them.")
        super().__init__(options, torch_device=f"cuda:{options.device_index}",
                         mixed_precision=mixed_precision)
