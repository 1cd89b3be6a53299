"""The captured step replayed as a CUDA graph on a CUDA wafer.

Two parts:

* :func:`plan` decides, from the captured fx graph and its input spec alone, whether the step
  can be recorded into a ``torch.cuda.CUDAGraph`` and, where not, every reason why. It is pure
  (no GPU needed), so the decision is tested on CPU on real captured steps. A graph replays
  recorded kernels with recorded addresses and recorded launch parameters: nothing in the step
  may read a value on the host (``.item()``, ``nonzero``, shapes that depend on values), branch
  on a value (control-flow ops), run on the CPU, or draw random numbers from a generator the
  host hands over each step.
* :class:`CudaStepRunner` runs the wafer's steps on a CUDA device: each batch is copied into a
  pinned host buffer and from there, on a side stream, into one of two device buffers while the
  previous step runs; the step is recorded once (after a first plain step, which also warms up
  the kernels) with static input and output buffers, then replayed every step. The state
  tensors are the graph's own inputs and outputs: they are updated in place. Outputs are copied
  on the device and read back only when the client asks for them. Per step, CUDA events time
  the device's compute and the device's idle gap before it (:mod:`executor.gpu_busy`); nothing
  waits for the device except the reuse of a pinned buffer two steps later.

Where :func:`plan` says no, or ``cuda_graph=False``, the runner runs the program as before
(the same input path and timing, no graph); the run summary says why.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from executor.engine.compiler import generator_overload, is_random
from executor.engine.devices import device_bound_ops
from workers.torch_compat import HigherOrderOperator, OpOverload

InputSpec = tuple  # (shape, dtype, device as text)


def spec_of(tensors: Sequence[torch.Tensor]) -> list[InputSpec]:
    """The input spec :func:`plan` takes: per tensor its shape, dtype and device."""
    return [(tuple(t.shape), t.dtype, str(t.device)) for t in tensors]


@dataclass(frozen=True)
class GraphPlan:
    """Whether the step is recorded as a CUDA graph, and why not where it is not."""

    record: bool
    reasons: tuple = ()
    option: object = "auto"

    def to_dict(self) -> dict:
        return {"option": self.option, "recordable": self.record, "why_not": list(self.reasons)}


_HOST_READ = torch.Tag.data_dependent_output
_VALUE_SHAPED = torch.Tag.dynamic_output_shape


def _symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(not isinstance(s, int) for s in value.shape)
    if isinstance(value, (list, tuple)):
        return any(_symbolic(v) for v in value)
    return False


def _index_by_position(node: torch.fx.Node) -> bool:
    """``aten.index.Tensor`` with integer indices only (``x[idx]``, an embedding's gather): its
    output's shape is the indices', fixed. Boolean masks (``x[x > 0]``) are value-shaped."""
    if node.target is not torch.ops.aten.index.Tensor:
        return False
    for index in node.args[1]:
        val = getattr(index, "meta", {}).get("val") if index is not None else None
        if val is not None and val.dtype in (torch.bool, torch.uint8):
            return False
    return True


def _node_reasons(gm: torch.fx.GraphModule) -> list[str]:
    found = []
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            found.append(f"{node.name}: calls Python ({node.op} {node.target}); a CUDA graph holds "
                         "only kernels")
            continue
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, HigherOrderOperator):
            found.append(f"{node.name}: {target.name()} is control flow on a value (dynamic "
                         "control flow); a CUDA graph replays one path")
        elif isinstance(target, OpOverload):
            if _HOST_READ in target.tags:
                found.append(f"{node.name}: {target} reads a value on the host (a "
                             "synchronisation the graph cannot hold)")
            elif _VALUE_SHAPED in target.tags and not _index_by_position(node):
                found.append(f"{node.name}: {target} makes an output whose shape depends on "
                             "values (data-dependent shape; the host must read it)")
            elif is_random(node) and generator_overload(target) is None:
                found.append(f"{node.name}: {target} draws random numbers and takes no "
                             "generator, so the host would lend it the wafer's generator each "
                             "step (random op without a graph-safe generator)")
            elif _symbolic(node.meta.get("val")):
                found.append(f"{node.name}: {target} has a shape that is not fixed (symbolic: "
                             "decided when the step runs)")
        elif target is not operator.getitem:
            found.append(f"{node.name}: calls Python ({getattr(target, '__name__', target)}); "
                         "a CUDA graph holds only kernels")
    return found


def plan(gm: torch.fx.GraphModule, inputs: Sequence[InputSpec], device, *,
         option="auto", retrace: bool = False) -> GraphPlan:
    """Whether the captured step ``gm`` with inputs ``inputs`` (:func:`spec_of`: the state,
    the batch and the step's other tensors, on the wafer) can be recorded as a CUDA graph on
    ``device``, and every reason it cannot. ``option`` is the backend's ``cuda_graph``;
    ``retrace``: the step is traced again every iteration (``retrace_every_iteration``)."""
    device = torch.device(device)
    reasons = []
    if option is False:
        reasons.append("cuda_graph=False")
    if device.type != "cuda":
        reasons.append(f"the wafer runs on {device.type}; CUDA graphs need device='cuda'")
    if retrace:
        reasons.append("retrace_every_iteration=True traces the step again every iteration")
    for i, (shape, dtype, where) in enumerate(inputs):
        if torch.device(where).type == "cpu":
            reasons.append(f"input {i} ({list(shape)} {dtype}) is a CPU tensor: a graph would "
                           "keep the value it had when recorded")
    reasons += [f"{line} (a CPU op)" for line in device_bound_ops(gm, "cuda")]
    reasons += _node_reasons(gm)
    return GraphPlan(not reasons, tuple(reasons), option)


# -- running steps on a CUDA device --------------------------------------------------------------
def _own_memory(outputs: list, batch: list) -> list:
    """``outputs``, with a copy of each one that shares memory with the batch (a step that
    returns its input, or a view of it): the batch's buffer is filled again two steps later,
    and the output must keep this step's value."""
    memory = {t.untyped_storage().data_ptr() for t in batch}
    return [o.clone() if isinstance(o, torch.Tensor)
            and o.untyped_storage().data_ptr() in memory else o for o in outputs]


@dataclass
class _Slot:
    """One of the two input slots: pinned host buffers, the device buffers the side stream fills
    from them, and the events that order the copies with the steps."""

    pinned: list
    landing: list
    copied: Optional[torch.cuda.Event] = None    # the side stream's copy into ``landing`` done
    consumed: Optional[torch.cuda.Event] = None  # the step that read ``landing`` done with it


@dataclass
class _Timed:
    step: int
    start: torch.cuda.Event
    end: torch.cuda.Event


@dataclass
class _Recorded:
    """A recorded step: the graph, what it reads and what it writes."""

    graph: object
    step_fn: object            # the compiled step it records (re-recorded when it changes)
    state: list
    batch: list
    consts: list
    consts_from: object
    outputs: list = field(default_factory=list)


class CudaStepRunner:
    """Runs each step of a CUDA wafer (see the module docstring): ``runner(program, state,
    host_batch, step) -> outputs``. ``graph_plan``: :func:`plan`'s decision; ``report``: a dict
    the runner keeps up to date (recorded at which step, replays, why it stopped)."""

    def __init__(self, device: torch.device, graph_plan: GraphPlan, report: dict):
        self.device = device
        self.plan = graph_plan
        self.report = report
        report.update(graph_plan.to_dict(), recorded_at_step=None, replays=0, plain_steps=0)
        self.side = torch.cuda.Stream(device)
        self._slots: list[Optional[_Slot]] = [None, None]
        self._recorded: Optional[_Recorded] = None
        self._failed = not graph_plan.record
        self._pending: list[_Timed] = []
        self._last_end: Optional[torch.cuda.Event] = None
        self._batch_read: Optional[torch.cuda.Event] = None
        self._observed: dict = {}  # replayed step -> who is told its device time

    # -- input ---------------------------------------------------------------------------------
    def _stage(self, host: list, step: int) -> list:
        """``host``'s tensors in one of two device buffers, copied from pinned memory on the
        side stream; the current stream waits for the copy."""
        k = step % 2
        slot = self._slots[k]
        if slot is None or [t.shape for t in slot.pinned] != [t.shape for t in host] or \
                [t.dtype for t in slot.pinned] != [t.dtype for t in host]:
            slot = self._slots[k] = _Slot(
                [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in host],
                [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in host])
        if slot.copied is not None:
            slot.copied.synchronize()  # the copy out of the pinned buffers two steps ago
        for p, t in zip(slot.pinned, host):
            p.copy_(t)
        main = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.side):
            if slot.consumed is not None:
                self.side.wait_event(slot.consumed)
            for d, p in zip(slot.landing, slot.pinned):
                d.copy_(p, non_blocking=True)
            slot.copied = torch.cuda.Event()
            slot.copied.record(self.side)
        main.wait_event(slot.copied)
        return slot.landing

    # -- a step --------------------------------------------------------------------------------
    def __call__(self, program, state: list, host: list, step: int) -> list:
        batch = self._stage(host, step)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        settled = getattr(program, "settled", lambda: True)()
        step_fn = getattr(program, "active", None)
        if self._failed or not settled or step_fn is None or self.report["plain_steps"] == 0:
            outputs = _own_memory(program(state, batch, step), batch)
            self.report["plain_steps"] += 1
        else:
            outputs = self._replay(program, step_fn, state, batch, step, start)
        end.record()
        self._slots[step % 2].consumed = self._batch_read or end
        self._batch_read = None
        self._pending.append(_Timed(step, start, end))
        if not settled:  # the program times its steps on the host (tiered compilation)
            torch.cuda.synchronize(self.device)
        return outputs

    def _replay(self, program, step_fn, state: list, batch: list, step: int,
                start: torch.cuda.Event) -> list:
        rec = self._recorded
        if rec is None or rec.step_fn is not step_fn or \
                [t.shape for t in rec.batch] != [t.shape for t in batch]:
            rec = self._record(program, step_fn, state, batch, step)
            start.record()  # the step's device time leaves the recording out
            if rec is None:
                return _own_memory(program(state, batch, step), batch)
        for i, (now, static) in enumerate(zip(state, rec.state)):
            if now is not static:  # the state was replaced (a checkpoint loaded between runs)
                static.copy_(now)
                state[i] = static
        if program.consts is not rec.consts_from:
            for static, value in zip(rec.consts, program.consts):
                static.copy_(value)
            rec.consts_from = program.consts
        for static, value in zip(rec.batch, batch):
            static.copy_(value)
        self._batch_read = torch.cuda.Event()
        self._batch_read.record()  # the side stream may fill this slot again from here
        rec.graph.replay()
        self.report["replays"] += 1
        self._observed[step] = getattr(program, "observe", None)
        return [o.clone() for o in rec.outputs]

    def _record(self, program, step_fn, state: list, batch: list, step: int):
        """Record ``step_fn`` over the current state; None (and the reason in the report) where
        it cannot be."""
        if getattr(step_fn, "lends_generator", False):
            return self._give_up("the compiled step draws random numbers from torch's default "
                                 "generator, lent to it by the host each step (random op "
                                 "without a graph-safe generator)")
        static_batch = [t.clone() for t in batch]
        consts = [c.clone() for c in program.consts]
        graph = torch.cuda.CUDAGraph()
        generator = getattr(program, "generator", None)
        torch.cuda.synchronize(self.device)
        try:
            if generator is not None and getattr(program, "draws_random", False):
                graph.register_generator_state(generator)
            # thread_local: the client's reads in other threads (in-process, or the actor's
            # call threads on Ray) go on while the wafer thread records
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                written = list(state)
                outputs = step_fn(written, static_batch, consts)
                for static, new in zip(state, written):
                    if new is not static:
                        static.copy_(new)
        except Exception as e:  # an op that cannot be recorded: the plain replay goes on
            torch.cuda.synchronize(self.device)
            return self._give_up(f"recording failed: {type(e).__name__}: {e}")
        self._recorded = _Recorded(graph, step_fn, list(state), static_batch, consts,
                                   program.consts, list(outputs))
        self.report["recorded_at_step"] = step + 1
        self.report["recorded_for"] = getattr(step_fn, "compiler", None)
        return self._recorded

    def _give_up(self, reason: str):
        self._failed = True
        self.report["recordable"] = False
        self.report["why_not"] = [*self.report["why_not"], reason]
        return None

    # -- timings -------------------------------------------------------------------------------
    def finished_timings(self, block: bool = False) -> list[tuple[int, dict]]:
        """``(step, {"device_compute_s", "device_idle_s"})`` of every step whose events
        completed, in step order (``block``: wait for all)."""
        done = []
        while self._pending and (block or self._pending[0].end.query()):
            t = self._pending.pop(0)
            if block:
                t.end.synchronize()
            idle = 0.0 if self._last_end is None else \
                max(0.0, self._last_end.elapsed_time(t.start) / 1e3)
            compute = t.start.elapsed_time(t.end) / 1e3
            done.append((t.step, {"device_compute_s": compute, "device_idle_s": idle}))
            self._last_end = t.end
            observe = self._observed.pop(t.step, None)
            if observe is not None:
                observe(t.step, compute)
        return done
