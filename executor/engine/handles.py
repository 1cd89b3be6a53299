"""State handles: tensors whose values live with the engine, not in the client.

Every tensor that persists across steps on the CSX backend (parameters, buffers, optimizer state,
learning rates, scaler and metric state) is a :class:`StateHandle`: a ``torch.Tensor`` wrapper
subclass pointing at a :class:`Slot`. The slot holds the value, wherever it is:

* ``lazy``   -- not materialised yet: a recorded init program (created under ``with backend.device``);
* ``host``   -- a real tensor in this process (before the first run, after ``load_state_dict``);
* ``remote`` -- resident in the wafer driver; reads fetch it, when reads are allowed;
* ``dropped``-- no value (``drop_data``/``compile_only``): a checkpoint must be loaded.

While a step is captured, the engine points every slot at a placeholder and the handles' dispatch
unwraps them, so ``make_fx`` records aten ops on the placeholders (see :mod:`executor.engine.capture`).
Aliases (``param.detach()``, ``nn.Parameter(handle)``) share the slot, so identity survives.
"""

from __future__ import annotations

import contextlib
import itertools
from copy import deepcopy
import weakref
from typing import Callable, Optional

import torch
from torch.utils._pytree import tree_map_only

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


class Slot:
    """The value behind one state tensor (shared by all its aliases)."""

    __slots__ = ("key", "kind", "value", "program", "store", "name", "readable", "__weakref__")

    def __init__(self, store: "Store", kind: str, value: torch.Tensor, program=None, name=None):
        self.key = next(_ids)
        self.kind = kind          # lazy | host | remote | dropped | temp
        self.value = value        # real tensor (host), meta tensor (lazy/remote/dropped), proxy (capture)
        self.program = program    # LazyInit for lazy slots
        self.store = store
        self.name = name
        self.readable = False     # exported after every step, for reads in step closures

    @property
    def meta(self) -> torch.Tensor:
        v = self.value
        return v if v.device.type == "meta" else v.to("meta")


class LazyInit:
    """A recorded initialisation: a factory call followed by in-place ops (with RNG states)."""

    def __init__(self, shape, dtype, fill=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.fill = fill
        self.ops: list[tuple] = []  # (op name, args, kwargs, rng_state or None)

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
        r = torch.Tensor._make_wrapper_subclass(
            cls, meta.shape, dtype=meta.dtype, device="cpu", requires_grad=requires_grad,
            strides=meta.stride(),
        )
        r._slot = slot
        return r

    @property
    def inner(self) -> torch.Tensor:
        return self._slot.value

    def __repr__(self, *, tensor_contents=None):
        store = self._slot.store
        if store.capturing:
            store.refuse("printing a tensor (repr)")
        if self._slot.kind == "temp":
            return f"StateHandle(temp, shape={tuple(self.shape)}, dtype={self.dtype})"
        try:
            value = store.read(self._slot)
        except Exception:
            return (f"StateHandle({self._slot.kind}, shape={tuple(self.shape)}, "
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
        if slot.kind in ("temp", "batch", "output") or store.capturing:
            store.refuse("copy.deepcopy of a tensor")
        if slot.kind == "lazy":
            program = LazyInit(slot.program.shape, slot.program.dtype, slot.program.fill)
            program.ops = list(slot.program.ops)
            new = store.new_slot("lazy", slot.value, program)
        else:
            new = store.new_slot("host", store.read(slot).clone())
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
        with torch._C.DisableTorchFunctionSubclass():
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
    schema = func._schema
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

    ``fetch(slots)`` / ``push(slot, value)`` are supplied by the backend: they move values to
    and from wherever ``remote`` slots live (the wafer driver).
    """

    def __init__(self):
        self._slots: "weakref.WeakValueDictionary[int, Slot]" = weakref.WeakValueDictionary()
        self._keepalive: dict[int, Slot] = {}
        self.capturing = False
        self.closed = False
        self.running = False           # a run is streaming: weights are on the wafer
        self.read_context: Optional[Callable[[list], dict]] = None  # checkpoint-closure reader
        self.fetch: Optional[Callable[[list], dict]] = None
        self.push: Optional[Callable[[Slot, torch.Tensor], None]] = None
        self.on_capture_state_op: Optional[Callable] = None
        self.output_reader: Optional[Callable[[Slot], torch.Tensor]] = None
        # inside a step closure: the value of a readable slot after that step, else None
        self.step_reader: Optional[Callable[[Slot], Optional[torch.Tensor]]] = None

    def refuse(self, what: str):
        from executor.engine.guards import read_error

        raise read_error(what)

    # -- creating state ----------------------------------------------------------------------
    def new_slot(self, kind, value, program=None, name=None) -> Slot:
        if self.capturing and kind in ("lazy", "host"):
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
        slot = Slot(self, kind, value, program, name)
        if kind in ("lazy", "host", "remote", "dropped"):
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
        slot = self.new_slot("host", t, name=name)
        slot.readable = readable
        return self.handle(slot)

    def lazy(self, shape, dtype, fill=None, name=None) -> StateHandle:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        return self.handle(self.new_slot("lazy", meta, LazyInit(shape, dtype, fill), name))

    def slots(self) -> list[Slot]:
        """Live state slots, in creation order."""
        return [s for _, s in sorted(self._slots.items())]

    def keep_alive(self, slots) -> None:
        for s in slots:
            self._keepalive[s.key] = s

    # -- values ------------------------------------------------------------------------------
    def host_value(self, slot: Slot) -> torch.Tensor:
        """Materialise a lazy or host slot in this process (used when shipping state)."""
        if slot.kind == "lazy":
            return slot.program.materialize()
        if slot.kind == "host":
            return slot.value
        raise AssertionError(slot.kind)

    def read(self, slot: Slot) -> torch.Tensor:
        if slot.kind == "temp":
            return slot.value
        if self.capturing:
            self.refuse("reading a state tensor's value")
        if slot.kind == "output":
            if self.output_reader is None:
                raise RuntimeError(
                    f"{slot.name} is no longer available: step outputs can be read during their "
                    "run (inside a @cstream.step_closure), not after it ended."
                )
            return self.output_reader(slot)
        if slot.kind == "batch":
            raise RuntimeError(
                "the batch streams from the input workers straight to the wafer; the client "
                "never holds its values. Use it inside the traced step, or pass it to a "
                "@cstream.step_closure from inside the step."
            )
        if slot.kind == "host":
            return slot.value
        if slot.kind == "lazy":
            value = slot.program.materialize()
            slot.kind, slot.value, slot.program = "host", value, None
            return value
        if slot.kind == "dropped":
            raise RuntimeError(
                "this tensor's data was dropped (the backend was created with drop_data, "
                "compile_only or validate_only); load a checkpoint with load_state_dict first."
            )
        if self.closed:
            raise RuntimeError(
                "this tensor's value lived on the wafer of a backend that was shut down; read "
                "what you need (metrics, state_dict) before backend.shutdown()."
            )
        if self.read_context is not None:
            return self.read_context([slot])[slot.key]
        if self.step_reader is not None:
            value = self.step_reader(slot)
            if value is not None:
                return value
        if self.running:
            raise RuntimeError(
                "the weights and optimizer state live on the wafer during a run and can only be "
                "read on checkpoint steps: read them inside a @cstream.checkpoint_closure (set "
                "checkpoint_steps on the DataExecutor), or after the run."
            )
        return self.fetch([slot])[slot.key]

    def write(self, slot: Slot, value: torch.Tensor) -> None:
        if self.running and slot.kind == "remote":
            raise RuntimeError(
                "state tensors cannot be changed while a run is streaming; write them before "
                "iterating the executor (e.g. load_state_dict) or inside the traced step."
            )
        if slot.kind == "remote":
            self.push(slot, value)
        else:
            slot.kind, slot.value, slot.program = "host", value, None

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
        if isinstance(target, StateHandle) and target._slot.kind == "lazy" and (
            not any(isinstance(a, StateHandle) and a is not target for a in args[1:])
        ):
            return self._record_lazy(func, target, args, kwargs)
        if func in _ALIAS_OPS and isinstance(args[0], StateHandle) and args[0]._slot.kind != "temp":
            return self.handle(args[0]._slot)
        # everything else runs on real values
        values = {}

        def unwrap(h):
            if h._slot.key not in values:
                values[h._slot.key] = self.read(h._slot)
            return values[h._slot.key]

        if isinstance(target, StateHandle) and target._slot.kind != "temp":
            slot = target._slot
            if func in _OVERWRITE and slot.kind in ("remote", "dropped") and args[0] is target:
                value = torch.empty(slot.value.shape, dtype=slot.value.dtype)
            else:
                value = unwrap(target)
                if slot.kind == "remote":
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
        slot.program.ops.append((name, rest, dict(kwargs), rng))
        return target

    def _dispatch_capture(self, func, args, kwargs):
        uargs = tree_map_only(StateHandle, lambda h: h._slot.value, args)
        ukw = tree_map_only(StateHandle, lambda h: h._slot.value, kwargs)
        out = func(*uargs, **ukw)
        target = _mutated_arg(func, args, kwargs)
        if isinstance(target, StateHandle):
            if self.on_capture_state_op is not None and target._slot.kind != "temp":
                self.on_capture_state_op(target._slot)
            return target
        return tree_map_only(
            torch.Tensor, lambda t: self.handle(self.new_slot("temp", t)), out
        )

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


def unwrap_temp(x):
    """The inner value of a temporary handle (capture outputs), or ``x`` itself."""
    if isinstance(x, StateHandle):
        return x._slot.value
    return x
