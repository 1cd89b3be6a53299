"""State handles: tensors whose values live with the engine, not in the client.

Every tensor that persists across steps on the CSX backend (parameters, buffers, optimizer state,
learning rates, scaler and metric state) is a :class:`StateHandle`: a ``torch.Tensor`` wrapper
subclass pointing at a :class:`Slot`. The slot holds the value, wherever it is; its
:class:`SlotKind` says where, and so how a read is answered.

While a step is captured, the engine points every slot at a placeholder and the handles' dispatch
unwraps them, so ``make_fx`` records aten ops on the placeholders (see :mod:`executor.engine.capture`).
Aliases (``param.detach()``, ``nn.Parameter(handle)``) share the slot, so identity survives.
Values that are not in this process (on the wafer, or outputs of a step) are read and written
through the :class:`RemoteValues` the backend gives its :class:`Store`.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import weakref
from copy import deepcopy
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from workers.torch_compat import (DisableTorchFunctionSubclass, make_wrapper_subclass, op_schema,
                                  tree_map_only)

_ALIAS_OPS = {torch.ops.aten.detach.default, torch.ops.aten.alias.default}
RANDOM_INPLACE = {
    "uniform_", "normal_", "bernoulli_", "random_", "exponential_", "cauchy_", "log_normal_",
    "geometric_",
}
_ids = itertools.count()
_OVERWRITE = {torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar,
              torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default}
_VALUE_FUNCS = {torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.to,
                torch.Tensor.__array__, torch.Tensor.item}


class SlotKind(enum.Enum):
    """Where a slot's value is."""

    LAZY = "lazy"        # not materialised yet: ``Slot.init`` records how (``with backend.device``)
    HOST = "host"        # a real tensor in this process (before the first run, after loading)
    REMOTE = "remote"    # resident in the wafer driver; reads fetch it, when reads are allowed
    DROPPED = "dropped"  # no value (drop_data, compile_only, validate_only): load a checkpoint
    TEMP = "temp"        # an intermediate of the step being captured: its value is the placeholder
    BATCH = "batch"      # a leaf of a batch: its values stream to the wafer, never to the client
    OUTPUT = "output"    # one output of one step (``Slot.output``), readable during its run


STATE_KINDS = frozenset({SlotKind.LAZY, SlotKind.HOST, SlotKind.REMOTE, SlotKind.DROPPED})
"""The kinds of state: values that persist from step to step, which the store keeps a list of."""


@dataclass(frozen=True)
class StepOutput:
    """Which output of which step an ``OUTPUT`` slot stands for."""

    step: int   # the executor's iteration, counted from 0
    index: int  # the output's index among the captured graph's outputs


class Slot:
    """The value behind one state tensor (shared by all its aliases)."""

    __slots__ = ("key", "kind", "value", "init", "output", "store", "name", "readable",
                 "__weakref__")

    def __init__(self, store: "Store", kind: SlotKind, value: torch.Tensor,
                 init: Optional["LazyInit"] = None, output: Optional[StepOutput] = None,
                 name: Optional[str] = None):
        self.key = next(_ids)
        self.kind = kind
        # HOST: the real tensor; LAZY, REMOTE, DROPPED, OUTPUT: a meta tensor (shape, dtype);
        # BATCH: the batch spec's tensor; TEMP, and state and batch slots while a step is
        # captured: the placeholder the trace records ops on
        self.value = value
        self.init = init          # LAZY only: how to materialise the value
        self.output = output      # OUTPUT only: which output of which step
        self.store = store
        self.name = name
        self.readable = False     # exported after every step, for reads in step closures

    @property
    def meta(self) -> torch.Tensor:
        v = self.value
        return v if v.device.type == "meta" else v.to("meta")

    def hold(self, value: torch.Tensor) -> None:
        """The value is now ``value``, a real tensor in this process."""
        self.kind, self.value, self.init = SlotKind.HOST, value, None

    def moved_to_wafer(self) -> None:
        """The value was sent to the wafer driver, which keeps it from now on."""
        self.kind, self.value, self.init = SlotKind.REMOTE, self.meta, None

    def drop(self) -> None:
        """Forget the value (``drop_data``): only its shape and dtype stay."""
        self.kind, self.value, self.init = SlotKind.DROPPED, self.meta, None


class RemoteValues(Protocol):
    """Where the values that are not in this process are read and written: the backend that
    makes a :class:`Store` implements it and passes it in."""

    def read_state(self, slot: Slot) -> torch.Tensor:
        """The value of a ``REMOTE`` slot. During a run, only where the run allows it (inside
        a checkpoint closure, or a step closure reading readable state); refused elsewhere."""

    def write_state(self, slot: Slot, value: torch.Tensor) -> None:
        """Replace the value of a ``REMOTE`` slot where it lives (refused during a run)."""

    def read_output(self, slot: Slot) -> torch.Tensor:
        """The value of an ``OUTPUT`` slot; refused once the run of its step ended."""


class LazyInit:
    """A recorded initialisation: a factory call followed by in-place ops (with RNG states)."""

    def __init__(self, shape, dtype, fill=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.fill = fill
        self.ops: list[tuple] = []  # (op name, args, kwargs, rng_state or None)

    def copy(self) -> "LazyInit":
        """The same initialisation, recorded apart (ops added to one do not reach the other)."""
        program = LazyInit(self.shape, self.dtype, self.fill)
        program.ops = list(self.ops)
        return program

    def materialize(self) -> torch.Tensor:
        t = torch.empty(self.shape, dtype=self.dtype) if self.fill is None else torch.full(
            self.shape, self.fill, dtype=self.dtype)
        for name, args, kwargs, rng in self.ops:
            op = getattr(torch.ops.aten, name)
            if rng is not None:
                saved = torch.get_rng_state()
                torch.set_rng_state(rng)
                try:
                    op(t, *args, **kwargs)
                finally:
                    torch.set_rng_state(saved)
            else:
                op(t, *args, **kwargs)
        return t


class StateHandle(torch.Tensor):
    """A tensor whose value lives in a :class:`Slot` (see the module docstring)."""

    _slot: Slot

    @staticmethod
    def __new__(cls, slot: Slot, requires_grad: bool = False):
        meta = slot.value
        r = make_wrapper_subclass(
            cls, meta.shape, dtype=meta.dtype, device="cpu", requires_grad=requires_grad,
            strides=meta.stride(),
        )
        r._slot = slot
        return r

    @property
    def slot(self) -> Slot:
        """The slot holding this tensor's value (shared with its aliases)."""
        return self._slot

    def __repr__(self, *, tensor_contents=None):
        store = self._slot.store
        if store.capturing:
            store.refuse("printing a tensor (repr)")
        if self._slot.kind is SlotKind.TEMP:
            return f"StateHandle(temp, shape={tuple(self.shape)}, dtype={self.dtype})"
        try:
            value = store.read(self._slot)
        except Exception:
            return (f"StateHandle({self._slot.kind.value}, shape={tuple(self.shape)}, "
                    f"dtype={self.dtype})")
        return repr(value)

    def __deepcopy__(self, memo):
        """A new state tensor with this one's value (``copy.deepcopy`` of a module built under
        ``backend.device``: transformer layer stacks are made that way). A lazy value stays
        lazy: the copy replays the same recorded initialisation, so it equals the original as an
        eager copy would."""
        if id(self) in memo:
            return memo[id(self)]
        slot, store = self._slot, self._slot.store
        if slot.kind not in STATE_KINDS or store.capturing:
            store.refuse("copy.deepcopy of a tensor")
        if slot.kind is SlotKind.LAZY:
            new = store.new_slot(SlotKind.LAZY, slot.value, init=slot.init.copy())
        else:
            new = store.new_slot(SlotKind.HOST, store.read(slot).clone())
        new.readable = slot.readable
        copy = store.handle(new, requires_grad=self.requires_grad)
        memo[id(self)] = copy
        for k, v in self.__dict__.items():  # e.g. nn.Parameter's _is_param marker
            if k != "_slot":
                setattr(copy, k, deepcopy(v, memo))
        return copy

    def __reduce_ex__(self, proto):
        return (torch.Tensor.clone, (self._slot.store.read(self._slot),))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        store = _store_of(args, kwargs)
        if store is not None:
            hook = store.torch_function_hook(func, args, kwargs)
            if hook is not NotImplemented:
                return hook
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        store = _store_of(args, kwargs)
        return store.dispatch(func, args, kwargs)


def _store_of(args, kwargs) -> Optional["Store"]:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, StateHandle):
            return a._slot.store
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, StateHandle):
                    return b._slot.store
    return None


def _mutated_arg(func, args, kwargs):
    """The argument an in-place/out op writes to (None for functional ops)."""
    schema = op_schema(func)
    if not schema.is_mutable:
        return None
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            if a.kwarg_only:
                return kwargs.get(a.name)
            return args[i] if i < len(args) else kwargs.get(a.name)
    return None


class Store:
    """All state slots of one backend, and the rules for reading and writing them.

    ``remote`` (the backend) holds the values that are not in this process: ``REMOTE`` state
    on the wafer driver, and ``OUTPUT`` values of the steps of a run.
    """

    def __init__(self, remote: RemoteValues):
        self.remote = remote
        self._slots: "weakref.WeakValueDictionary[int, Slot]" = weakref.WeakValueDictionary()
        self.capturing = False
        self.closed = False  # the backend shut down: values on the wafer are gone
        # (module, buffer name, its state handle) of every compiled model's buffers
        self._buffers: list[tuple[weakref.ref, str, StateHandle]] = []

    def refuse(self, what: str):
        from executor.engine.guards import read_error

        raise read_error(what)

    def close(self) -> None:
        """The backend shut down: reads of values that lived on the wafer are refused."""
        self.closed = True

    # -- creating state ----------------------------------------------------------------------
    def new_slot(self, kind: SlotKind, value: torch.Tensor, init: Optional[LazyInit] = None,
                 output: Optional[StepOutput] = None, name: Optional[str] = None) -> Slot:
        if self.capturing and kind in (SlotKind.LAZY, SlotKind.HOST):
            from executor.engine.errors import TracingError
            from executor.engine.guards import user_frame

            fn, line, src = user_frame()
            raise TracingError(
                f"a state tensor was created inside the traced step at {fn}:{line}"
                + (f" (`{src}`)" if src else "") + ". State (cstream.zeros/ones/full/*_like, "
                "optimizer state, metric state) lives on the wafer and is fed from one step to "
                "the next, so it must exist before the step is traced: create it outside the "
                "step, e.g. in the optimizer's preinitialize() or the metric's constructor."
            )
        slot = Slot(self, kind, value, init, output, name)
        if kind in STATE_KINDS:
            self._slots[slot.key] = slot
        return slot

    def handle(self, slot: Slot, requires_grad=False) -> StateHandle:
        return StateHandle(slot, requires_grad=requires_grad)

    def from_tensor(self, tensor: torch.Tensor, name=None, readable=False) -> StateHandle:
        """A state handle holding (a detached copy-free reference to) ``tensor``.

        ``readable`` state (metric state) is exported by every step, so step closures can read
        its value after their step.
        """
        t = tensor.detach()
        if isinstance(t, StateHandle):
            return t
        slot = self.new_slot(SlotKind.HOST, t, name=name)
        slot.readable = readable
        return self.handle(slot)

    def model_state(self, tensor: torch.Tensor, name: str, drop: bool) -> StateHandle:
        """``tensor``, a parameter or buffer called ``name``, as state: a handle already is one
        (it is named ``name`` unless it has a name); ``drop``: its value is forgotten."""
        if isinstance(tensor, StateHandle):
            slot = tensor._slot
            if slot.name is None:
                slot.name = name
            if drop and slot.kind in (SlotKind.HOST, SlotKind.LAZY):
                slot.drop()
            return tensor
        h = self.from_tensor(tensor, name=name)
        if drop:
            h._slot.drop()
        return h

    def lazy(self, shape, dtype, fill=None, name=None) -> StateHandle:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        return self.handle(self.new_slot(SlotKind.LAZY, meta, LazyInit(shape, dtype, fill),
                                         name=name))

    def batch(self, value: torch.Tensor, name: str) -> StateHandle:
        """A leaf of a batch, ``value`` its shape and dtype (the values never reach here)."""
        return self.handle(self.new_slot(SlotKind.BATCH, value, name=name))

    def output(self, meta: torch.Tensor, output: StepOutput, name: str) -> StateHandle:
        """One output of one step of a run, read from the run when it is used."""
        return self.handle(self.new_slot(SlotKind.OUTPUT, meta, output=output, name=name))

    def slots(self, *kinds: SlotKind) -> list[Slot]:
        """Live state slots (of ``kinds``, when given), in creation order."""
        return [s for _, s in sorted(self._slots.items()) if not kinds or s.kind in kinds]

    # -- values ------------------------------------------------------------------------------
    def read(self, slot: Slot) -> torch.Tensor:
        if slot.kind is SlotKind.TEMP:
            return slot.value
        if self.capturing:
            self.refuse("reading a state tensor's value")
        if slot.kind is SlotKind.OUTPUT:
            return self.remote.read_output(slot)
        if slot.kind is SlotKind.BATCH:
            raise RuntimeError(
                "the batch streams from the input workers straight to the wafer; the client "
                "never holds its values. Use it inside the traced step, or pass it to a "
                "@cstream.step_closure from inside the step."
            )
        if slot.kind is SlotKind.HOST:
            return slot.value
        if slot.kind is SlotKind.LAZY:
            value = slot.init.materialize()
            slot.hold(value)
            return value
        if slot.kind is SlotKind.DROPPED:
            raise RuntimeError(
                "this tensor's data was dropped (the backend was created with drop_data, "
                "compile_only or validate_only); load a checkpoint with load_state_dict first."
            )
        if self.closed:
            raise RuntimeError(
                "this tensor's value lived on the wafer of a backend that was shut down; read "
                "what you need (metrics, state_dict) before backend.shutdown()."
            )
        return self.remote.read_state(slot)

    def write(self, slot: Slot, value: torch.Tensor) -> None:
        if slot.kind is SlotKind.REMOTE:
            self.remote.write_state(slot, value)
        else:
            slot.hold(value)

    # -- dispatch ----------------------------------------------------------------------------
    def torch_function_hook(self, func, args, kwargs):
        """Outside a capture, conversions that leave torch (numpy, tolist, cpu, to) run on
        the value: a state handle read this way gives a plain tensor."""
        if self.capturing or func not in _VALUE_FUNCS or not isinstance(args[0], StateHandle):
            return NotImplemented
        value = self.read(args[0]._slot)
        return func(value, *args[1:], **kwargs)

    def dispatch(self, func, args, kwargs):
        if self.capturing:
            return self._dispatch_capture(func, args, kwargs)
        target = _mutated_arg(func, args, kwargs)
        if isinstance(target, StateHandle) and target._slot.kind is SlotKind.LAZY and (
            not any(isinstance(a, StateHandle) and a is not target for a in args[1:])
        ):
            return self._record_lazy(func, target, args, kwargs)
        if func in _ALIAS_OPS and isinstance(args[0], StateHandle) and \
                args[0]._slot.kind is not SlotKind.TEMP:
            return self.handle(args[0]._slot)
        # everything else runs on real values
        values = {}

        def unwrap(h):
            if h._slot.key not in values:
                values[h._slot.key] = self.read(h._slot)
            return values[h._slot.key]

        if isinstance(target, StateHandle) and target._slot.kind is not SlotKind.TEMP:
            slot = target._slot
            if func in _OVERWRITE and slot.kind in (SlotKind.REMOTE, SlotKind.DROPPED) and \
                    args[0] is target:
                value = torch.empty(slot.value.shape, dtype=slot.value.dtype)
            else:
                value = unwrap(target)
                if slot.kind is SlotKind.REMOTE:
                    value = value.clone()
            values[slot.key] = value
            uargs = tree_map_only(StateHandle, unwrap, args)
            ukw = tree_map_only(StateHandle, unwrap, kwargs)
            func(*uargs, **ukw)
            self.write(slot, value)
            return target
        uargs = tree_map_only(StateHandle, unwrap, args)
        ukw = tree_map_only(StateHandle, unwrap, kwargs)
        return func(*uargs, **ukw)

    def _record_lazy(self, func, target: StateHandle, args, kwargs):
        slot = target._slot
        name = func.overloadpacket.__name__
        rng = None
        if name in RANDOM_INPLACE:
            rng = torch.get_rng_state()
            # advance this process's generator exactly as eager initialisation would, so later
            # random numbers (dropout, shuffling) match the CPU backend
            scratch = torch.empty(slot.value.shape, dtype=slot.value.dtype)
            func(scratch, *args[1:], **kwargs)
            del scratch
        rest = tuple(
            a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args[1:]
        )
        slot.init.ops.append((name, rest, dict(kwargs), rng))
        return target

    def _dispatch_capture(self, func, args, kwargs):
        uargs = tree_map_only(StateHandle, lambda h: h._slot.value, args)
        ukw = tree_map_only(StateHandle, lambda h: h._slot.value, kwargs)
        out = func(*uargs, **ukw)
        target = _mutated_arg(func, args, kwargs)
        if isinstance(target, StateHandle):
            return target
        return tree_map_only(
            torch.Tensor, lambda t: self.handle(self.new_slot(SlotKind.TEMP, t)), out
        )

    def bind_buffer(self, module: torch.nn.Module, name: str, handle: StateHandle) -> None:
        """Remember that buffer ``name`` of ``module`` is the state ``handle``."""
        self._buffers.append((weakref.ref(module), name, handle))

    def take_reassigned_buffers(self) -> None:
        """While a step is captured, after it ran: each buffer the step assigned a new tensor to
        (``self.center = self.center * m + ...``, as the Model Zoo's DINO losses do) gets that
        tensor as its state's value after the step, cast to the buffer's dtype, and the module's
        attribute is the state handle again, so the next step starts from what this one
        assigned, as it does eagerly."""
        for ref, name, handle in self._buffers:
            module = ref()
            current = None if module is None else module._buffers.get(name)
            if current is None or current is handle:
                continue
            value = current._slot.value if isinstance(current, StateHandle) else current
            if tuple(value.shape) != tuple(handle.shape):
                from executor.engine.errors import TracingError

                raise TracingError(
                    f"the traced step assigned a tensor of shape {tuple(value.shape)} to the "
                    f"buffer {handle._slot.name or name} of shape {tuple(handle.shape)}: a "
                    "buffer is state, which keeps its shape from step to step.")
            handle._slot.value = value.to(handle.dtype)
            module._buffers[name] = handle

    @contextlib.contextmanager
    def capturing_values(self, slots_and_values):
        """Point slots at placeholders for the duration of a capture."""
        saved = [(s, s.value) for s, _ in slots_and_values]
        for s, v in slots_and_values:
            s.value = v
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False
            for s, v in saved:
                s.value = v
