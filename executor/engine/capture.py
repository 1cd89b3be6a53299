"""Capture one step of user code into a static aten graph with ``make_fx``.

The captured function takes ``(state, batch, consts)`` -- the values of every state slot, the
batch leaves and any other tensors the step was called with -- and returns ``(state, outputs)``:
every slot's value after the step and the tensors the step returned or handed to step closures.
Ops on state are recorded in place; :mod:`executor.engine.compiler` turns that into what runs.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensorMode)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from executor.engine.errors import TracingError
from executor.engine.guards import ReadGuard, user_frame_of, value_dependent_error
from executor.engine.handles import Slot, StateHandle, Store
from executor.engine.portable import portable


@dataclass
class OutputLeaf:
    """Where a leaf of the step's return value (or of a closure argument) comes from."""

    index: int  # index into the graph's outputs
    meta: torch.Tensor = None  # shape and dtype, on the meta device


@dataclass
class Captured:
    graph: torch.fx.GraphModule
    state_slots: list[Slot]
    batch_metas: list[tuple]              # (shape, dtype) per batch leaf
    const_positions: list[int]             # leaves of (args, kwargs) that are plain tensors
    out_spec: Any                          # pytree spec of the return value
    out_leaves: list                       # OutputLeaf or a constant, per leaf
    closures: list = field(default_factory=list)  # (fn, spec, leaves) of closures in the step
    readable: dict = field(default_factory=dict)  # slot key -> output index of its value
    num_outputs: int = 0
    trace_s: float = 0.0
    ops: list[str] = field(default_factory=list)

    def op_listing(self) -> list[str]:
        return self.ops

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


def capture(store: Store, fn: Callable, args, kwargs, take_closures: Callable[[], list],
            param_handles, devices=()) -> Captured:
    """Trace ``fn(*args, **kwargs)`` once with fake values; nothing is computed. ``devices``
    name the wafer (the backend's device): ``.to()`` to one of them moves nothing."""
    t0 = time.perf_counter()
    leaves, spec = tree_flatten((args, kwargs))
    batch_pos, const_pos = [], []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, StateHandle) and leaf._slot.kind == "batch":
            batch_pos.append(i)
        elif isinstance(leaf, torch.Tensor) and not isinstance(leaf, StateHandle):
            const_pos.append(i)
    slots = store.slots()
    batch_slots = [leaves[i]._slot for i in batch_pos]
    for h in list(param_handles):
        h.grad = None  # gradients left over from eager code would be baked in

    mode = FakeTensorMode()
    f_state = [_fake(mode, s.meta if s.kind != "host" else s.value) for s in slots]
    f_batch = [_fake(mode, s.value) for s in batch_slots]
    f_const = [mode.from_tensor(leaves[i]) for i in const_pos]
    result: dict = {}

    def traced(state_vals, batch_vals, const_vals):
        pairs = list(zip(slots, state_vals)) + list(zip(batch_slots, batch_vals))
        new_leaves = list(leaves)
        for i, v in zip(const_pos, const_vals):
            new_leaves[i] = v
        a, k = tree_unflatten(new_leaves, spec)
        with store.capturing_values(pairs), ReadGuard(devices):
            out = fn(*a, **k)
            closures = take_closures()
            outputs: list[torch.Tensor] = []

            def as_leaf(x):
                if isinstance(x, StateHandle):
                    x = x._slot.value
                elif not isinstance(x, torch.Tensor):
                    return x
                outputs.append(x)
                meta = torch.empty(x.shape, dtype=x.dtype, device="meta")
                return OutputLeaf(len(outputs) - 1, meta)

            o_leaves, o_spec = tree_flatten(out)
            result["out"] = (o_spec, [as_leaf(x) for x in o_leaves])
            recorded = []
            for cfn, cargs, ckwargs, checkpoint in closures:
                if checkpoint:
                    raise TracingError(
                        f"checkpoint closure {cfn.__qualname__} was called inside the traced "
                        "step; call it in the training loop, after the step."
                    )
                c_leaves, c_spec = tree_flatten((cargs, ckwargs))
                recorded.append((cfn, c_spec, [as_leaf(x) for x in c_leaves]))
            result["closures"] = recorded
            # step closures (called inside this step or in the loop) may read readable state
            # (metrics, small): export its value after every step
            readable = {}
            for s in slots:
                if s.readable:
                    outputs.append(s.value.clone())
                    readable[s.key] = len(outputs) - 1
            result["readable"] = readable
            return [s.value for s in slots], outputs

    try:
        with mode:
            gm = make_fx(traced, tracing_mode="real")(f_state, f_batch, f_const)
    except TracingError:
        raise
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        raise value_dependent_error(e) from None
    except TypeError as e:
        m = re.search(r"argument '(\w+)' must be Number, not StateHandle", str(e))
        if m is None:
            raise
        name = m.group(1)
        fn_, line, src = user_frame_of(e.__traceback__)
        raise TracingError(
            f"`{name}=` was given a traced tensor at {fn_}:{line}" + (f" (`{src}`)" if src else "")
            + f": `{name}` must be a Python number, and a traced tensor has no value at trace "
            "time (it would be read as a random or stale value). Fix: multiply explicitly, e.g. "
            f"`x.add_(y * t)` instead of `x.add_(y, {name}=t)`."
        ) from None
    except Exception as e:
        if "FakeTensor" in str(e) and "non-Fake" in str(e) or "convert all Tensors" in str(e):
            raise TracingError(
                "the traced step used a tensor that is neither a state tensor (model parameter or "
                "buffer, optimizer state created in preinitialize, cstream.zeros/full/...) nor "
                "part of the batch, so its current value would be baked into the graph. Create "
                "it with cstream's creation ops (cstream.zeros_like, cstream.full, ...) or "
                "register it as a module buffer before cstream.compile."
            ) from e
        raise
    finally:
        for h in list(param_handles):
            h.grad = None
    o_spec, o_leaves = result["out"]
    cap = Captured(
        graph=portable(gm),  # it travels pickled (to a Ray driver, to the compile process)
        state_slots=slots,
        batch_metas=[(tuple(s.value.shape), s.value.dtype) for s in batch_slots],
        const_positions=const_pos,
        out_spec=o_spec,
        out_leaves=o_leaves,
        closures=result["closures"],
        readable=result["readable"],
        trace_s=time.perf_counter() - t0,
    )
    cap.num_outputs = sum(isinstance(x, OutputLeaf) for x in o_leaves) + sum(
        isinstance(x, OutputLeaf) for _, _, ls in cap.closures for x in ls
    ) + len(cap.readable)
    cap.ops = _ops_of(gm)
    return cap
