"""Capture one step of user code into a static aten graph with ``make_fx``.

The captured function takes ``(state, batch, consts)`` -- the values of every state slot, the
batch leaves and any other tensors the step was called with -- and returns ``(state, outputs)``:
every slot's value after the step and the tensors the step returned or handed to step closures.
Ops on state are recorded in place; :mod:`executor.engine.compiler` turns that into what runs.

:func:`capture` reads as its phases: the inputs sorted and given placeholders
(:func:`prepare_inputs`), the step traced (:class:`_StepTrace`) with torch's errors translated
(:func:`_as_tracing_error`), and the :class:`Captured` program built from both.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from executor.engine.devices import neutral_dispatch, retarget
from executor.engine.errors import TracingError
from executor.engine.guards import (ReadGuard, not_state_error, scalar_argument_error,
                                    value_dependent_error)
from executor.engine.handles import Slot, SlotKind, StateHandle, Store
from executor.engine.portable import portable
from workers.torch_compat import (DataDependentOutputException, DynamicOutputShapeException,
                                  FakeTensorMode, TreeSpec, is_non_fake_input_error,
                                  scalar_argument_given_a_tensor, tree_flatten, tree_unflatten)


@dataclass
class OutputLeaf:
    """Where a leaf of the step's return value (or of a closure argument) comes from."""

    index: int  # index into the graph's outputs
    meta: torch.Tensor = None  # shape and dtype, on the meta device


class StepClosure(NamedTuple):
    """A step closure the step called: queued again with each step's outputs."""

    fn: Callable
    spec: TreeSpec  # pytree spec of its (args, kwargs)
    leaves: list    # OutputLeaf or a constant, per leaf


@dataclass(frozen=True)
class Captured:
    """One step, captured: the graph and how its inputs and outputs map to the step's."""

    graph: torch.fx.GraphModule
    state_slots: list[Slot]          # the graph's state inputs and outputs, in order
    batch_metas: list[tuple]         # (shape, dtype) per batch leaf
    const_positions: list[int]       # leaves of (args, kwargs) that are plain tensors
    out_spec: Any                    # pytree spec of the return value
    out_leaves: list                 # OutputLeaf or a constant, per leaf
    closures: list[StepClosure]      # step closures called in the step
    readable: dict[int, int]         # slot key -> output index of its value after the step
    trace_s: float                   # seconds the capture took
    ops: list[str]                   # the graph's nodes as text (to compare two traces)

    @property
    def num_ops(self) -> int:
        """Ops the graph runs: every node but inputs, the output and tuple unpacking."""
        return sum(1 for op in self.ops if "getitem" not in op and not op.startswith("output"))


def _fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "meta":
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return mode.from_tensor(t)


def _ops_of(gm: torch.fx.GraphModule) -> list[str]:
    names = {}
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            names[n] = f"in{len(names)}"
            continue
        names[n] = f"v{len(names)}"
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: names.get(a, "?"))
        out.append(f"{n.op} {n.target} {args}")
    return out


def first_difference(old: list[str], new: list[str]) -> str:
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return f"op #{i}: the first trace had `{a}`, this one has `{b}`"
    if len(old) != len(new):
        i = min(len(old), len(new))
        longer = old if len(old) > len(new) else new
        which = "first trace" if longer is old else "new trace"
        return (f"op #{i}: the {which} has more ops ({len(old)} vs {len(new)}), starting with "
                f"`{longer[i]}`")
    return "no difference"


@dataclass
class StepInputs:
    """The step's arguments sorted into the graph's three inputs, and a placeholder for each."""

    leaves: list                # the leaves of (args, kwargs)
    spec: TreeSpec
    state_slots: list[Slot]     # every live state slot
    batch_slots: list[Slot]     # the batch handles among the leaves
    const_positions: list[int]  # the leaves that are plain tensors
    mode: FakeTensorMode        # the placeholders' mode, active while the step is traced
    placeholders: tuple         # (state, batch, consts): fake values, shapes and dtypes only

    def with_consts(self, const_values: list) -> tuple:
        """``(args, kwargs)`` with the plain tensors replaced by ``const_values``."""
        leaves = list(self.leaves)
        for i, v in zip(self.const_positions, const_values):
            leaves[i] = v
        return tree_unflatten(leaves, self.spec)


def prepare_inputs(store: Store, args, kwargs) -> StepInputs:
    """Sort the leaves of ``(args, kwargs)`` into batch handles and plain tensors (other
    leaves are constants of the trace), and make the placeholders the step is traced on."""
    leaves, spec = tree_flatten((args, kwargs))
    batch_pos = [i for i, x in enumerate(leaves)
                 if isinstance(x, StateHandle) and x.slot.kind is SlotKind.BATCH]
    const_pos = [i for i, x in enumerate(leaves)
                 if isinstance(x, torch.Tensor) and not isinstance(x, StateHandle)]
    state_slots = store.slots()
    batch_slots = [leaves[i].slot for i in batch_pos]
    mode = FakeTensorMode()
    placeholders = (
        [_fake(mode, s.meta if s.kind is not SlotKind.HOST else s.value) for s in state_slots],
        [_fake(mode, s.value) for s in batch_slots],
        [mode.from_tensor(leaves[i]) for i in const_pos],
    )
    return StepInputs(leaves, spec, state_slots, batch_slots, const_pos, mode, placeholders)


@dataclass(frozen=True)
class _Recorded:
    """What one trace learned besides the graph."""

    out_spec: Any
    out_leaves: list
    closures: list[StepClosure]
    readable: dict[int, int]


class _GraphOutputs:
    """The graph's outputs, numbered in the order they are added."""

    def __init__(self):
        self.tensors: list[torch.Tensor] = []

    def add(self, x):
        """``x`` as a graph output (its :class:`OutputLeaf`), or ``x`` itself when it is not a
        tensor (a constant of the trace)."""
        if isinstance(x, StateHandle):
            x = x.slot.value
        elif not isinstance(x, torch.Tensor):
            return x
        self.tensors.append(x)
        return OutputLeaf(len(self.tensors) - 1, torch.empty(x.shape, dtype=x.dtype, device="meta"))

    def add_closure(self, fn, args, kwargs, checkpoint: bool) -> StepClosure:
        """A step closure the step called, its tensor arguments made graph outputs."""
        if checkpoint:
            raise TracingError(
                f"checkpoint closure {fn.__qualname__} was called inside the traced "
                "step; call it in the training loop, after the step."
            )
        leaves, spec = tree_flatten((args, kwargs))
        return StepClosure(fn, spec, [self.add(x) for x in leaves])

    def add_readable(self, slots: list[Slot]) -> dict[int, int]:
        """The value after the step of each readable slot (metric state, small), as outputs:
        step closures, called inside the step or in the loop, may read it. Slot key -> index."""
        return {s.key: self.add(s.value.clone()).index for s in slots if s.readable}


class _StepTrace:
    """The function ``make_fx`` traces, ``(state, batch, consts) -> (state after, outputs)``:
    the user's step run on placeholders. What the graph cannot return (the structure of the
    step's return value, the closures it called, where readable state is exported) is kept in
    ``recorded``."""

    def __init__(self, store: Store, fn: Callable, inputs: StepInputs,
                 take_closures: Callable[[], list], devices):
        self.store, self.fn, self.inputs = store, fn, inputs
        self.take_closures, self.devices = take_closures, devices
        self.recorded: Optional[_Recorded] = None

    def graph(self) -> torch.fx.GraphModule:
        # make_fx counts the parameters of the function's code, which for a method include self
        def traced(state_values, batch_values, const_values):
            return self.run(state_values, batch_values, const_values)

        with self.inputs.mode:
            return make_fx(traced, tracing_mode="real")(*self.inputs.placeholders)

    def run(self, state_values: list, batch_values: list, const_values: list):
        inputs = self.inputs
        args, kwargs = inputs.with_consts(const_values)
        placed = [*zip(inputs.state_slots, state_values), *zip(inputs.batch_slots, batch_values)]
        with self.store.capturing_values(placed), ReadGuard(self.devices):
            returned = self.fn(*args, **kwargs)
            self.store.take_reassigned_buffers()
            called = self.take_closures()
            outputs = _GraphOutputs()
            out_leaves, out_spec = tree_flatten(returned)
            self.recorded = _Recorded(
                out_spec=out_spec,
                out_leaves=[outputs.add(x) for x in out_leaves],
                closures=[outputs.add_closure(*c) for c in called],
                readable=outputs.add_readable(inputs.state_slots),
            )
            return [s.value for s in inputs.state_slots], outputs.tensors


def _as_tracing_error(e: Exception) -> Optional[TracingError]:
    """torch's error ``e`` for what a traced step cannot hold, as a :class:`TracingError` with
    the user's line and the fix; None for any other error. Its ``__cause__`` is torch's error
    where that names the op (a tensor from outside the step), else None."""
    if isinstance(e, (DynamicOutputShapeException, DataDependentOutputException)):
        return value_dependent_error(e)
    name = scalar_argument_given_a_tensor(e, StateHandle.__name__)
    if name is not None:
        return scalar_argument_error(name, e)
    if is_non_fake_input_error(e):
        error = not_state_error()
        error.__cause__ = e
        return error
    return None


@contextlib.contextmanager
def _no_gradients(param_handles):
    """Parameters without ``.grad`` while the step is traced, and after: gradients left over
    from eager code would be baked in, and those of the trace are placeholders."""
    for h in list(param_handles):
        h.grad = None
    try:
        yield
    finally:
        for h in list(param_handles):
            h.grad = None


def capture(store: Store, fn: Callable, args, kwargs, take_closures: Callable[[], list],
            param_handles, devices=(), target="cpu") -> Captured:
    """Trace ``fn(*args, **kwargs)`` once with fake values; nothing is computed.
    ``take_closures()`` returns the closures queued since the step began, as
    ``(fn, args, kwargs, is_checkpoint_closure)``, and removes them from the queue.
    ``devices`` name the wafer (the backend's device): ``.to()`` to one of them moves nothing.
    ``target`` is the device the wafer runs the graph on: for one other than the CPU, the step
    is captured with device-neutral dispatch and its device arguments name ``target``
    (:mod:`executor.engine.devices`)."""
    t0 = time.perf_counter()
    inputs = prepare_inputs(store, args, kwargs)
    trace = _StepTrace(store, fn, inputs, take_closures, devices)
    with _no_gradients(param_handles), neutral_dispatch(target):
        try:
            graph = trace.graph()
        except Exception as e:
            error = _as_tracing_error(e)
            if error is None:
                raise
            raise error from error.__cause__
    recorded = trace.recorded
    graph = retarget(graph, target)
    return Captured(
        graph=portable(graph),  # it travels pickled (to a Ray driver, to the compile process)
        state_slots=inputs.state_slots,
        batch_metas=[(tuple(s.value.shape), s.value.dtype) for s in inputs.batch_slots],
        const_positions=inputs.const_positions,
        out_spec=recorded.out_spec,
        out_leaves=recorded.out_leaves,
        closures=recorded.closures,
        readable=recorded.readable,
        trace_s=time.perf_counter() - t0,
        ops=_ops_of(graph),
    )
