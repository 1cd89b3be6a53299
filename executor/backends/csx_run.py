"""One run on the CSX backend: the client's side of the asynchronous client/wafer pair.

Phases of a traced step (one screen):

1. first call  -- capture the step on the batch spec (no values), ship state, compile, start the
                  wafer, which then runs steps back to back;
2. later calls -- replay: nothing is traced; the call returns handles for this step's outputs and
                  re-queues the step closures that were called inside the step;
   (``retrace_every_iteration``: capture again, compare with the first graph, refuse a change);
3. closures    -- read the outputs they need. Outputs handed to step closures stream back in
                  batches: one ``collect`` call brings every step the wafer finished since the
                  last one (and tells the wafer how far the client is), so a closure on a step
                  already done costs no call. The client blocks only when a closure needs a step
                  the wafer has not finished, or when it is ``lookahead`` steps ahead.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from typing import Optional

import torch

from executor import phases
from executor.backends.base import RunContext
from executor.backends.csx_outputs import WaferOutputs
from executor.backends.snapshot_fetch import SnapshotFetch
from executor.driver import DriverError, matmul_flops
from executor.engine import warmup
from executor.engine.capture import Captured, OutputLeaf, capture, first_difference
from executor.engine.devices import device_bound_ops
from executor.engine.errors import CompileError
from executor.engine.handles import SlotKind, StateHandle, StepOutput
from executor.tensor_hooks import after_tensor_to_cpu
from executor.wafer import cuda_graph as cuda_graphs
from workers.aggregates import run_resume_states
from workers.errors import UnshardedInputWarning
from workers.flow import FlowPolicy
from workers.torch_compat import tree_flatten, tree_unflatten

log = logging.getLogger("cstream")

STREAMED_MAX_NUMEL = 1 << 16
"""Returned tensors up to this many elements stream back with every step; larger ones are
fetched when read."""


class CSXRun:
    """A run on the CSX backend (the :class:`~executor.backends.base.Run` interface): the
    input workers stream to the wafer, which runs the traced step ahead of the client.

    How far the wafer is, and what came back of its steps, is :attr:`outputs`
    (:class:`~executor.backends.csx_outputs.WaferOutputs`); the client's own position is the
    context's (``context.iteration()``: it has finished every step before that one).
    What it compiled is :attr:`compile_report`; :meth:`close` returns the run's summary, and
    :meth:`wafer_stats` the wafer's per-step figures, which the executor adds to its records.
    """

    has_wafer = True

    def __init__(self, backend, context: RunContext):
        self._t_created = time.perf_counter()
        self.backend = backend
        self.context = context
        self.store = backend.store
        self.driver = backend.driver()
        cs = context.cs_config
        self.policy = FlowPolicy.from_config(cs, lookahead_steps=backend.options.lookahead)
        n = cs.num_csx * cs.num_workers_per_csx
        with phases.phase(f"starting {n} input worker{'s' if n > 1 else ''}"):
            spec = self.driver.open_input(
                context.dataloader, cs,
                run_resume_states(context.dataloader, cs.num_csx, cs.num_workers_per_csx),
                self.policy)
        self.input_checks = self.driver.input_checks()
        duplicates = self.input_checks.get("duplicates")
        if duplicates is not None:
            # stacklevel: CSXRun -> Backend.start_run -> DataExecutor.__iter__ -> the user's loop
            warnings.warn(duplicates["message"], UnshardedInputWarning, stacklevel=4)
        self._open_input_s = time.perf_counter() - self._t_created
        self.spec_leaves, self.spec = tree_flatten(spec)
        tensors = [t for t in self.spec_leaves if isinstance(t, torch.Tensor)]
        self.samples = int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 1
        self.traced = None
        self.captured: Optional[Captured] = None
        self.started = False
        self.outputs = WaferOutputs(self.driver, self.policy, context)
        """The steps' outputs and figures as they come back from the wafer."""
        self._checkpoint_step: Optional[int] = None  # the step whose checkpoint closures run
        self.compile_report: dict = {}
        self._last_consts: Optional[list] = None  # plain-tensor step arguments last sent
        self._consts_sent = None  # the last asynchronous feed of them
        self._checkpoint_reader = None  # inside a checkpoint closure: slot -> value at its step
        self._closure_reader = None  # inside a step closure: slot -> readable value, or None

    # -- batches -------------------------------------------------------------------------------
    def next_batch(self, step: int):
        la = self.policy.lookahead_steps
        if self.started and step - self.outputs.wafer_done > la:
            # wait until the wafer is half the look-ahead behind, not just inside it: the next
            # la/2 steps then go without a call
            self.outputs.collect(step - self.policy.ack_every_steps)
        leaves = [
            self.store.batch(t, name=f"batch[{i}]") if isinstance(t, torch.Tensor) else t
            for i, t in enumerate(self.spec_leaves)
        ]
        return tree_unflatten(leaves, self.spec)

    def samples_in_step(self, step: int) -> int:
        return self.samples

    # -- the step ------------------------------------------------------------------------------
    def step(self, traced, args, kwargs):
        ctx = self.context
        if self.traced is not None and traced is not self.traced:
            raise CompileError(
                f"{traced!r} is the second traced step called in this run (the first was "
                f"{self.traced!r}); the wafer runs one static graph per run. Run it in a separate "
                "DataExecutor."
            )
        self.traced = traced
        cap = self.captured
        if cap is None or self.backend.options.retrace_every_iteration:
            mark = ctx.closures.mark()
            warmup.wait()
            self.backend.preinitialize_all()  # optimizer state exists before tracing
            with phases.phase("tracing"):
                new = capture(self.store, traced.run, args, kwargs,
                              lambda: ctx.closures.take_since(mark),
                              self.backend.param_handles(),
                              devices=(self.backend.device.torch_device,),
                              target=self.backend.options.device)
            if cap is not None and new.ops != cap.ops:
                raise CompileError(
                    f"the graph of {traced!r} changed at step {ctx.iteration() + 1}: "
                    f"{first_difference(cap.ops, new.ops)}. With retrace_every_iteration the "
                    "step is traced every iteration, but the wafer runs one static graph: Python "
                    "branches and loops must take the same path every step (use torch.where)."
                )
            cap = new
            log.info("traced %r: %d ops in %.3f s", traced, cap.num_ops, cap.trace_s)
        self.captured = cap
        if not self.started:
            leaves, _ = tree_flatten((args, kwargs))
            self._launch(cap, [leaves[i].detach().to("cpu") for i in cap.const_positions])
        step = ctx.iteration()
        if cap.const_positions:
            self._feed_consts(cap, step, args, kwargs)
        handles = self._outputs(cap, step)
        for fn, spec, leaves in cap.closures:
            cargs, ckwargs = tree_unflatten([handles.get(id(x), x) for x in leaves], spec)
            ctx.closures.add(fn, cargs, ckwargs, False)
        return tree_unflatten([handles.get(id(x), x) for x in cap.out_leaves], cap.out_spec)

    def _feed_consts(self, cap: Captured, step: int, args, kwargs) -> None:
        """Send this step's plain-tensor arguments (graph inputs) to the wafer; ``None`` when
        they equal the previous step's, so an unchanged tensor is not shipped again."""
        leaves, _ = tree_flatten((args, kwargs))
        values = [leaves[i].detach() for i in cap.const_positions]
        if self._last_consts is not None and all(
                a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
                for a, b in zip(values, self._last_consts)):
            sent = None
        else:
            sent = [v.to("cpu", copy=True) for v in values]
            self._last_consts = sent
        self._send_consts(step, sent)

    def _send_consts(self, step: int, sent: Optional[list]) -> None:
        if self._consts_sent is not None and self._consts_sent.ready():
            self._consts_sent.result()
        self._consts_sent = self.driver.feed_consts_async(step, sent)

    def _outputs(self, cap: Captured, step: int) -> dict:
        out = {}
        for leaf in list(cap.out_leaves) + [x for _, _, ls in cap.closures for x in ls]:
            if isinstance(leaf, OutputLeaf) and id(leaf) not in out:
                out[id(leaf)] = self.store.output(leaf.meta, StepOutput(step, leaf.index),
                                                  name=f"output {leaf.index} of step {step + 1}")
        return out

    def _launch(self, cap: Captured, consts: list) -> None:
        """Compile the captured step on the wafer and start it."""
        self.started = True
        self._compile(cap, consts, compile_only=False)
        # the wafer's random stream continues the client's (torch.manual_seed before the run),
        # or on a CUDA wafer its own from the last run
        self.driver.set_rng_state(self.backend.next_run_rng_state())
        self.driver.start(self.context.num_steps, sorted(self.context.checkpoint_steps))

    def _device_bound_ops(self, cap: Captured) -> list:
        """The captured step's ops tied to a device other than the wafer's."""
        device = self.backend.options.device
        # a graph for the CPU was captured with the CPU's own dispatch: nothing to check
        return [] if torch.device(device).type == "cpu" else device_bound_ops(cap.graph, device)

    def _compile(self, cap: Captured, consts: list, compile_only: bool) -> None:
        """Ship the state (or, ``compile_only``, its specs) and compile the step on the wafer."""
        b = self.backend
        device = b.options.device
        bound = self._device_bound_ops(cap)
        if bound:
            raise CompileError(
                f"the traced step cannot run on the wafer's device {device}: "
                f"{len(bound)} of its ops are tied to another device ({'; '.join(bound[:5])}"
                f"{' ...' if len(bound) > 5 else ''}). Write them with device-neutral torch "
                "calls, or run the wafer on the CPU (device=\"cpu\")."
            )
        b.sync_state_to_driver()
        with phases.phase("compiling"):
            self.compile_report = self.driver.load_program(
                cap.graph, [s.key for s in cap.state_slots], consts, cap.batch_metas,
                [(tuple(s.value.shape), s.value.dtype) for s in cap.state_slots],
                compile_only, self.context.num_steps,
                matmul_flops_per_step=matmul_flops(cap.graph), graph_code=cap.graph.code,
                retrace=b.options.retrace_every_iteration)
        self.outputs.streamed = streamed_outputs(cap)
        self.compile_report["trace_s"] = cap.trace_s
        self.compile_report["ops"] = cap.num_ops

    # -- end of step ---------------------------------------------------------------------------
    def end_step(self, step: int) -> dict:
        if not self.started:
            self._launch_without_model()
        return {"samples": self.samples}

    def _launch_without_model(self):
        self.started = True
        self.compile_report = self.driver.load_program(None, [], [], [])
        self.driver.start(self.context.num_steps, sorted(self.context.checkpoint_steps))

    def step_done(self, step: int) -> None:
        """The client finished ``step``'s closures. The wafer hears of it with the next
        ``collect``, or by an asynchronous ack every ``lookahead // 2`` steps when the client
        has nothing to collect: the wafer stays between half and all of the look-ahead in
        front of the client, for a fraction of the calls."""
        self.outputs.step_done(step)

    def read_output(self, slot) -> torch.Tensor:
        """The value of a step output's handle (an ``OUTPUT`` slot)."""
        return self.outputs.outputs_of(slot.output.step, [slot.output.index])[0]

    def read_state(self, slot) -> torch.Tensor:
        """The value of state on the wafer, read during this run: inside a checkpoint closure,
        its value at that step; inside a step closure, readable state after that step."""
        if self._checkpoint_reader is not None:
            return self._checkpoint_reader(slot)
        value = self._closure_reader(slot) if self._closure_reader is not None else None
        if value is None:
            raise RuntimeError(
                "the weights and optimizer state live on the wafer during a run and can only be "
                "read on checkpoint steps: read them inside a @cstream.checkpoint_closure (set "
                "checkpoint_steps on the DataExecutor), or after the run."
            )
        return value

    def wafer_stats(self) -> dict:
        """The wafer's per-step figures received so far, by step (counted from 1)."""
        return self.outputs.stats

    def materialize(self, obj, step: int):
        leaves, spec = tree_flatten(obj)
        wanted: dict[int, list] = {}
        for x in leaves:
            if isinstance(x, StateHandle) and x.slot.kind is SlotKind.OUTPUT:
                wanted.setdefault(x.slot.output.step, []).append(x.slot.output.index)
        if not wanted:
            return obj
        fetched = {}
        for s, idx in wanted.items():
            idx = sorted(set(idx))
            for i, v in zip(idx, self.outputs.outputs_of(s, idx)):
                fetched[StepOutput(s, i)] = v
                if isinstance(v, torch.Tensor):
                    after_tensor_to_cpu(v, f"step{s}.output{i}")
        return tree_unflatten([fetched[x.slot.output] if isinstance(x, StateHandle)
                               and x.slot.kind is SlotKind.OUTPUT else x for x in leaves], spec)

    @contextlib.contextmanager
    def closure_reads(self, step: int):
        """Inside a step closure: readable state (metrics) reads return the values after
        ``step``, exported by the step itself."""
        cap = self.captured
        if cap is None or not cap.readable:
            yield
            return
        cache: dict = {}

        def reader(slot):
            index = cap.readable.get(slot.key)
            if index is None:
                return None
            if not cache:  # metric state is small: one call brings all of it
                indices = sorted(cap.readable.values())
                cache.update(zip(indices, self.outputs.outputs_of(step, indices)))
            return cache[index]

        self._closure_reader = reader
        try:
            yield
        finally:
            self._closure_reader = None

    @contextlib.contextmanager
    def checkpoint_reads(self, step: int):
        """Inside a checkpoint closure: state reads return the values at ``step``."""
        fetch = SnapshotFetch(self.driver, step, self.store.slots(SlotKind.REMOTE))
        self._checkpoint_reader = fetch.read
        self._checkpoint_step = step
        try:
            yield
            self.driver.checkpoint_done(step + 1)
        finally:
            self._checkpoint_reader = None
            self._checkpoint_step = None
            fetch.close()

    def rng_state(self) -> torch.Tensor:
        """The wafer's generator state after the step of the running checkpoint closure."""
        return self.driver.snapshot(self._closure_step(), ["rng"])["rng"]

    def _closure_step(self) -> int:
        """The step of the running checkpoint closure."""
        if self._checkpoint_step is None:
            raise RuntimeError(
                "the random number generator state lives on the wafer during a run and can be "
                "read only on checkpoint steps: call cstream.get_rng_state() inside a "
                "@cstream.checkpoint_closure, or after the run.")
        return self._checkpoint_step

    def worker_states(self, step: int) -> list:
        return self.driver.worker_states(step)

    def autoscale_state(self, step: int) -> Optional[dict]:
        if not self.context.cs_config.autoscaling:
            return None
        return self.driver.autoscale_state(step)

    def progress_stats(self, step: int) -> Optional[dict]:
        """The wafer's newest per-step figures, fetched now (waits for ``step``, the step being
        run by the client, to finish on the wafer); None before the wafer started."""
        if not self.started:
            return None
        return self.outputs.newest(step)

    def close(self, ok: bool) -> dict:
        summary = {}
        try:
            summary = self._finish(ok)
        except DriverError as e:
            if ok:
                raise
            # the run is ending on an earlier error, which the user sees; a driver that died
            # with it cannot report, and saying so again would hide the first failure
            log.warning("the wafer driver could not end the run: %s", e)
        finally:
            self.backend.run_finished(self)
        summary["compile"] = {**self.compile_report, **summary.pop("program", {})}
        summary["collect_calls"] = self.outputs.collect_calls
        summary["input_checks"] = self.input_checks
        return summary

    def _finish(self, ok: bool) -> dict:
        """End the wafer's run (waiting for its last step when ``ok``); its summary."""
        if not self.started:
            self.driver.finish(wait=False)
            return {}
        summary = self.driver.finish(wait=ok)
        t_finished = time.perf_counter()
        rng_state = summary.pop("rng_state", None)
        if ok and rng_state is not None:
            self.backend.wafer_rng_ended(rng_state)
        self.outputs.add_stats(summary.pop("stats", []))
        summary["startup"] = self._startup(summary, t_finished)
        return summary

    def _startup(self, summary: dict, t_finished: float) -> dict:
        """Tracing, compile, input start-up and the time from the start of the run to the end
        of the first step on the wafer (the wafer's clock mapped onto this process's)."""
        startup = {**self.driver.startup, "trace_s": self.compile_report.get("trace_s"),
                   "compile_s": self.compile_report.get("compile_s"),
                   "open_input_s": self._open_input_s}
        first = self.outputs.stats.get(1)
        if first is not None and summary.get("wafer_wall_s") is not None:
            wafer_start = t_finished - summary["wafer_wall_s"]
            startup["time_to_first_step_s"] = wafer_start + first["wafer_t"] - self._t_created
        return startup


def validation_report(cap: Captured, consts: list, options, bound: list) -> dict:
    """What ``validate_only`` reports of a captured step: its ops, the device and the ops tied
    to another device; on a CUDA wafer, the CUDA graph's plan for it."""
    device = options.device
    report = {"validated": True, "trace_s": cap.trace_s, "ops": cap.num_ops,
              "device": str(device), "device_bound_ops": bound}
    if torch.device(device).type == "cuda":
        # every input lives on the wafer: the state, the batch and the step's tensors
        specs = [(tuple(s.value.shape), s.value.dtype, device) for s in cap.state_slots]
        specs += [(shape, dtype, device) for shape, dtype in cap.batch_metas]
        specs += [(tuple(c.shape), c.dtype, device) for c in consts]
        report["cuda_graph"] = cuda_graphs.plan(
            cap.graph, specs, device, option=options.cuda_graph,
            retrace=options.retrace_every_iteration).to_dict()
    return report


def streamed_outputs(cap: Captured) -> list:
    """The output indices that stream back with every step: the step closures' arguments, the
    step's small return values (a loss), which closures called in the loop are given, and,
    where the step has closures, the metrics they may read."""
    streamed = {leaf.index for _, _, ls in cap.closures for leaf in ls
                if isinstance(leaf, OutputLeaf)}
    streamed.update(leaf.index for leaf in cap.out_leaves if isinstance(leaf, OutputLeaf)
                    and leaf.meta.numel() <= STREAMED_MAX_NUMEL)
    if cap.closures:
        streamed.update(cap.readable.values())
    return sorted(streamed)
