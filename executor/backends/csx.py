"""``cstream.backend("CSX")``: the simulated Wafer-Scale Cluster.

The client holds handles; the wafer driver (a Ray actor, or an object in this process with
``in_process=True``) holds the values and runs the traced step.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from pathlib import Path
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from executor.backends.base import Backend, CompiledModel, RunContext
from executor.backends.csx_dry_run import CompileOnlyRun, ValidateOnlyRun
from executor.backends.csx_run import CSXRun
from executor.backends.options import CSXOptions
from executor.engine.handles import Slot, SlotKind, StateHandle, Store

log = logging.getLogger("cstream")

_FACTORIES = {torch.empty: None, torch.zeros: 0, torch.ones: 1}
_FROZEN: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_hook_installed = False


def _install_freeze_hook():
    global _hook_installed
    if _hook_installed:
        return

    def hook(module, name, param):
        if module in _FROZEN:
            raise RuntimeError(
                f"cannot set parameter {name!r} of {type(module).__name__}: the model was "
                "compiled with cstream.compile, which freezes its parameters. Finish building and "
                "initialising the model before cstream.compile; to change values use "
                "load_state_dict."
            )

    torch.nn.modules.module.register_module_parameter_registration_hook(hook)
    _hook_installed = True


class LazyInitMode(TorchFunctionMode):
    """``with backend.device:`` -- factory calls without a device create lazy state handles."""

    def __init__(self, store: Store):
        super().__init__()
        self.store = store

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and kwargs.get("device") is None and not kwargs.get("out"):
            size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) \
                else args
            dtype = kwargs.get("dtype") or torch.get_default_dtype()
            fill = _FACTORIES[func]
            h = self.store.lazy(tuple(size), dtype, fill=0 if fill is None else fill)
            if kwargs.get("requires_grad"):
                h.requires_grad_(True)
            return h
        if func is torch.full and kwargs.get("device") is None:
            size, value = args[0], args[1] if len(args) > 1 else kwargs["fill_value"]
            dtype = kwargs.get("dtype") or (torch.get_default_dtype() if isinstance(value, float)
                                            else None)
            if dtype is not None and not isinstance(value, torch.Tensor):
                return self.store.lazy(tuple(size), dtype, fill=value)
        return func(*args, **kwargs)


class CSXBackend(Backend):
    """The simulated Wafer-Scale Cluster; its options are :class:`CSXOptions`.

    The client holds handles; the wafer driver (a Ray actor, or an object in this process with
    ``in_process``) holds the values and runs the traced step.
    """

    name = "CSX"

    def __init__(self, options: CSXOptions, mixed_precision: Optional[bool] = None):
        if options.device.startswith("cuda") and options.in_process and \
                not options.validate_only and not torch.cuda.is_available():
            raise RuntimeError(f'cstream.backend("CSX", device={options.device!r}) needs CUDA, '
                               "which this machine does not have.")
        super().__init__(options, mixed_precision=mixed_precision)
        # resolved here, on the client: a driver on another node writes where the user said
        self.compile_dir = (Path(options.compile_dir) if options.compile_dir
                            else Path(self.artifact_dir) / "cached_compile").resolve()
        # the device config may change it (cstream.backends.csx.DeviceConfig.drop_data)
        self.drop_data = options.drop_data or options.compile_only or options.validate_only
        # validate_only traces for options.device and computes nothing: its driver only opens the
        # input, on the CPU, so a step for a GPU is checked on a machine without one
        self.driver_device = "cpu" if options.validate_only else options.device
        self.store = Store(remote=self)
        self._driver = None
        self.appliance = None  # the Cerebras appliance client: the simulated wafer has none
        self._params: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()
        self._models: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self._run: Optional[CSXRun] = None
        # a CUDA wafer's generator state for the next run, with this process's generator state
        # when it was kept (see next_run_rng_state)
        self._wafer_rng: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._last_run: Optional[CSXRun] = None
        _install_freeze_hook()
        from executor.engine import warmup

        warmup.start()  # the first trace's set-up, while Ray starts and the model is built
        self.driver()  # on Ray: starts Ray, and the driver actor in the background

    @property
    def forces_single_step(self) -> bool:
        return self.options.compile_only or self.options.validate_only

    # -- the driver ----------------------------------------------------------------------------
    def driver(self):
        if self._driver is None:
            from executor.backends.driver_client import DriverClient

            self._driver = DriverClient.create(self)
        return self._driver

    # -- values on the wafer (the store's RemoteValues) ------------------------------------------
    def read_state(self, slot: Slot) -> torch.Tensor:
        if self._run is not None:
            return self._run.read_state(slot)
        return self.driver().get_state([slot.key])[slot.key]

    def write_state(self, slot: Slot, value: torch.Tensor) -> None:
        if self._run is not None:
            raise RuntimeError(
                "state tensors cannot be changed while a run is streaming; write them before "
                "iterating the executor (e.g. load_state_dict) or inside the traced step."
            )
        self.driver().put_state({slot.key: value.detach().to("cpu")})

    def read_output(self, slot: Slot) -> torch.Tensor:
        if self._run is None:
            raise RuntimeError(
                f"{slot.name} is no longer available: step outputs can be read during their "
                "run (inside a @cstream.step_closure), not after it ended."
            )
        return self._run.read_output(slot)

    def sync_state_to_driver(self) -> None:
        """Ship every state tensor that is not on the wafer yet (lazy ones as programs)."""
        pending = self.store.slots(SlotKind.HOST, SlotKind.LAZY)
        dropped = self.store.slots(SlotKind.DROPPED)
        if dropped and not self.forces_single_step:
            names = ", ".join(s.name or f"#{s.key}" for s in dropped[:5])
            raise RuntimeError(
                f"{len(dropped)} state tensors have no data ({names}...): the backend was created "
                "with drop_data=True, so a checkpoint holding every state tensor must be loaded "
                "(model.load_state_dict / optimizer.load_state_dict) before running."
            )
        if not pending:
            return
        self.driver().put_state({s.key: s.init if s.kind is SlotKind.LAZY else s.value
                                 for s in pending})
        for s in pending:
            s.moved_to_wafer()

    # -- model, creation ops, device -------------------------------------------------------------
    def _to_handle(self, t: torch.Tensor, name: str) -> torch.Tensor:
        return self.store.model_state(t, name, drop=self.drop_data)

    def compile(self, model: torch.nn.Module) -> CompiledModel:
        seen: dict[int, torch.Tensor] = {}
        for mod_name, mod in model.named_modules(remove_duplicate=False):
            for pname, p in list(mod.named_parameters(recurse=False, remove_duplicate=False)):
                full = f"{mod_name}.{pname}" if mod_name else pname
                if id(p) not in seen:
                    if isinstance(p, StateHandle):
                        newp = p
                        self._to_handle(p, full)
                    else:
                        newp = torch.nn.Parameter(self._to_handle(p.data, full),
                                                  requires_grad=p.requires_grad)
                    seen[id(p)] = newp
                    self._params.add(newp)
                setattr(mod, pname, seen[id(p)])
            for bname, b in list(mod.named_buffers(recurse=False, remove_duplicate=False)):
                full = f"{mod_name}.{bname}" if mod_name else bname
                if id(b) not in seen:
                    seen[id(b)] = self._to_handle(b, full)
                setattr(mod, bname, seen[id(b)])
                self.store.bind_buffer(mod, bname, seen[id(b)])
        for mod in model.modules():
            _FROZEN.add(mod)
        self._models.add(model)
        if self.options.device != "cpu":
            log.info("the wafer driver executes on %s", self.options.device)
        return CompiledModel(model, self)

    def device_context(self):
        return LazyInitMode(self.store)

    def full(self, size, fill_value, dtype=None):
        if dtype is None:
            dtype = torch.get_default_dtype() if isinstance(fill_value, float) else (
                torch.bool if isinstance(fill_value, bool) else torch.int64)
        return self.store.lazy(tuple(size), dtype, fill=fill_value)

    def full_like(self, other, fill_value, dtype=None):
        return self.store.lazy(tuple(other.shape), dtype or other.dtype, fill=fill_value)

    def state_tensor(self, tensor, readable=False):
        return self.store.from_tensor(tensor, readable=readable)

    def param_handles(self):
        return [p for p in self._params]

    # -- randomness ------------------------------------------------------------------------------
    def get_rng_state(self) -> torch.Tensor:
        """Inside a checkpoint closure: the wafer's generator state after that step (a CUDA
        generator's on a CUDA wafer). Outside a run: the state the next run's wafer stream
        starts from (:meth:`next_run_rng_state`)."""
        if self._run is not None and self._run.started:
            return self._run.rng_state()
        return self.next_run_rng_state().clone()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """A CPU generator's state goes to this process's generator, which the next run's wafer
        stream starts from. On a CUDA wafer, a state of its generator (from
        :func:`cstream.get_rng_state` in a checkpoint closure of a run on that device) is kept
        and the next run's stream starts from it exactly."""
        if self._run is not None and self._run.started:
            raise RuntimeError(
                "cstream.set_rng_state was called during a run, while the wafer's random stream "
                "is running ahead of the client. Set it before iterating the executor (e.g. "
                "when loading a checkpoint); the run's wafer stream starts from it.")
        cpu_size = torch.get_rng_state().numel()
        if state.numel() == cpu_size:
            torch.set_rng_state(state)
            self._wafer_rng = None
        elif self.options.device != "cpu":
            self._wafer_rng = (state.clone(), torch.get_rng_state())
        else:
            raise ValueError(
                f"cstream.set_rng_state: the state has {state.numel()} bytes, but the CPU "
                f"generator of the CSX backend's wafer (device='cpu') keeps {cpu_size}: it was "
                "saved from another device's generator (a CUDA generator's state differs from a "
                "CPU one's). Restore it on the device it was saved on "
                "(cstream.backend(\"CSX\", device=\"cuda\") or the GPU backend), or seed this "
                "one with cstream.manual_seed.")

    def next_run_rng_state(self) -> torch.Tensor:
        """The state the next run's wafer stream starts from: this process's generator, or on a
        CUDA wafer the device state kept from the last run (or set_rng_state) while this
        process's generator has not changed since (torch.manual_seed re-seeds the stream)."""
        if self._wafer_rng is not None and torch.equal(self._wafer_rng[1], torch.get_rng_state()):
            return self._wafer_rng[0]
        return torch.get_rng_state()

    def wafer_rng_ended(self, state: torch.Tensor) -> None:
        """A run ended with the wafer's stream at ``state``; the next run continues it."""
        if self.options.device == "cpu":
            torch.set_rng_state(state)  # the client's generator continues, as after an eager run
        else:
            self._wafer_rng = (state.clone(), torch.get_rng_state())

    # -- steps and runs ------------------------------------------------------------------------
    def run_step(self, traced, args, kwargs):
        if self._run is None:
            raise RuntimeError(
                f"{traced!r} was called outside a run. On the CSX backend a traced step runs on "
                "the wafer: call it inside `for batch in executor:` with the executor's batch."
            )
        return self._run.step(traced, args, kwargs)

    def start_run(self, context: RunContext) -> CSXRun:
        """A run that executes its steps, or, with ``validate_only`` or ``compile_only``, the dry
        run that stops before the wafer runs one (:mod:`executor.backends.csx_dry_run`)."""
        kind = ValidateOnlyRun if self.options.validate_only else \
            CompileOnlyRun if self.options.compile_only else CSXRun
        self._run = self._last_run = kind(self, context)
        return self._run

    @property
    def last_compile(self) -> dict:
        """What the last run traced and compiled (its :attr:`CSXRun.compile_report`)."""
        return dict(self._last_run.compile_report) if self._last_run is not None else {}

    def run_finished(self, run) -> None:
        if self._run is run:
            self._run = None

    def shutdown(self) -> None:
        self.store.close()
        if self._driver is not None:
            with contextlib.suppress(Exception):
                self._driver.close()
            self._driver = None
        super().shutdown()

