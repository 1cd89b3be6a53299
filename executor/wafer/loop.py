"""The wafer loop: runs steps back to back as a small state machine.

Each call of :meth:`WaferLoop._step` makes one transition::

    READY ──(look-ahead used up)──▶ WAITING_FOR_CLIENT ──(client acks)──▶ READY
    READY ──(a CS-X's buffer empty)──▶ WAITING_FOR_INPUT ──(input arrives)──▶ step runs ──▶ READY
    WAITING_FOR_INPUT ──(longer than the stall bound: InputStallError)──▶ FAILED
    READY ──(last step done)──▶ FINISHED;   any ──(stop())──▶ STOPPED;   any ──(error)──▶ FAILED

:meth:`run` calls it until a terminal phase, in the driver's wafer thread; tests call it by hand
with ``block=False``. The client reads step outputs in batches (:meth:`collect`): one call
returns every finished step's outputs since the client's last call, and carries the client's
acknowledgement. The wafer never runs more than ``policy.lookahead_steps`` steps past the last
acknowledged step, so it never keeps more outputs than that.
"""

from __future__ import annotations

import enum
import gc
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from executor.wafer.feed import BatchSpecError, InputFeed, StepInput
from executor.wafer.state import StateStore
from workers.flow import FlowPolicy


class DriverError(RuntimeError):
    """The wafer failed while running a step."""


def _timeline_fields(infos: list, end_unix: float) -> dict:
    """The wall-clock times of a step for the run's timeline: its end, and per CS-X when its
    batch was produced by its worker and when it reached the wafer's side of the transport."""
    out = {"end_unix": end_unix}
    if all(i.produced_unix is not None for i in infos):
        out["produce_start_unix"] = [float(i.produced_unix[0]) for i in infos]
        out["produce_end_unix"] = [float(i.produced_unix[1]) for i in infos]
        out["received_unix"] = [float(i.received_unix or i.produced_unix[1]) for i in infos]
    if all(i.produce_cpu_s is not None for i in infos):
        out["produce_cpu_s"] = [float(i.produce_cpu_s) for i in infos]
    return out


class Phase(enum.Enum):
    READY = "ready"
    WAITING_FOR_CLIENT = "waiting for the client"
    WAITING_FOR_INPUT = "waiting for input"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.FINISHED, Phase.STOPPED, Phase.FAILED)


@dataclass(frozen=True)
class RunPlan:
    num_steps: int
    checkpoint_steps: frozenset
    num_csx: int = 1
    min_step_seconds: Callable[[int], float] = lambda samples_per_csx: 0.0
    """The simulated wafer's floor on a step's time, given the samples on one CS-X."""


@dataclass
class Collected:
    """What one :meth:`WaferLoop.collect` returns."""
    done: int
    """The last step the wafer finished."""
    first: int
    """The first step whose outputs ``values`` holds: it holds steps ``first`` to ``done``."""
    values: list
    """Per output index asked for, that output of every step from ``first`` to ``done``,
    stacked (one tensor per index, row ``k`` is step ``first + k``): one object to send
    instead of one per step."""
    stats: list
    """Per-step figures not sent before."""


class WaferLoop:
    """Args:
        state: the resident state tensors.
        feed: the run's input feed (started by the loop's owner).
        program: ``(state list, batch tensors) -> outputs``, updating the state list in place;
            None runs no model (the wafer only consumes input).
        state_order: the state keys in the order ``program`` takes them.
        plan: steps, checkpoint steps, the simulated speed.
        policy: the bounds (``lookahead_steps``).
        runner: on a CUDA device, what runs each step
            (:class:`executor.wafer.cuda_graph.CudaStepRunner`: pinned input copies on a side
            stream, the CUDA graph, CUDA-event timing); None: ``program`` is called directly.
            With a runner nothing waits for the device after a step: a step's figures are
            recorded once its events completed, with ``compute_s`` the device's time
            (``device_compute_s``), ``device_idle_s`` the device's gap before it and
            ``launch_s`` the host's time in the step.
        autoscaler: in an autoscaled run, its
            :class:`~executor.wafer.autoscaler.RunAutoscaler`: given every step's record as the
            step ends (a step boundary), and its state kept with each checkpoint step's
            input position.
    """

    def __init__(self, state: StateStore, feed: InputFeed, program, state_order: list,
                 plan: RunPlan, policy: FlowPolicy, device: torch.device,
                 rng: Optional[torch.Generator] = None, runner=None, autoscaler=None):
        self.state = state
        self.feed = feed
        self.program = program
        self.state_order = list(state_order)
        self.plan = plan
        self.policy = policy
        self.device = device
        self.rng = rng
        self.runner = runner
        self._awaiting_device: dict[int, dict] = {}  # step -> figures, until its events complete
        # plain-tensor step arguments, fed by the client for each step (None: unchanged)
        self.needs_consts = bool(getattr(program, "consts", None))
        self._fed_consts: dict[int, Optional[list]] = {}
        self.phase = Phase.READY
        self.next_step = 0
        self.done = -1
        self.acked = -1
        self.outputs: dict[int, list] = {}
        self.snapshots: dict[int, dict] = {}
        self.worker_states: dict[int, list] = {}
        self.autoscaler = autoscaler
        self.autoscale_states: dict[int, dict] = {}  # checkpoint step -> the controller's state
        self.stats: list[dict] = []
        self._stats_sent = 0
        self.error: Optional[BaseException] = None
        self.error_text: Optional[str] = None
        self.cond = threading.Condition()
        # the steps that threads blocked in wait_done/collect wait for: a finished step wakes
        # them only when it is one of these (not every step, which on a fast step would wake
        # them thousands of times a second for nothing)
        self._awaited: list[int] = []
        self._stop = False
        self._wait_t0: Optional[float] = None
        self._client_t0: Optional[float] = None  # since when the look-ahead is used up
        self._client_wait_s = 0.0
        self._occupancy = 0.0
        self._occupancy_per_csx: list = []
        self.t_start = time.perf_counter()

    # -- the state machine -----------------------------------------------------------------------
    def run(self) -> None:
        # the objects of the process when the run starts (Ray's, torch's, the program's: about
        # 270,000 in a driver) live as long as the run: frozen, a full collection does not
        # scan them (on the Ray driver one held a step for 0.22 s)
        gc.freeze()
        try:
            while not self.phase.terminal:
                self.phase = self._step(block=True)
        finally:
            gc.unfreeze()
        if self._awaiting_device:
            with self.cond:
                try:
                    self._add_device_timings(block=True)
                except Exception:  # the device failed: the step's error is already reported
                    pass

    def _add_device_timings(self, block: bool) -> None:
        for step, figures in self.runner.finished_timings(block):
            record = self._awaiting_device.pop(step)
            record["launch_s"] = record["compute_s"]
            record.update(figures, compute_s=figures["device_compute_s"])
            self._record(record)

    def _record(self, record: dict) -> None:
        """Keep a finished step's figures (holding :attr:`cond`); an autoscaled run's
        controller reads them at this step boundary."""
        if self.autoscaler is not None:
            self.autoscaler.after_step(record)
        self.stats.append(record)

    def _step(self, block: bool = True) -> Phase:
        try:
            return self._transition(block)
        except BaseException as e:  # reported to the client with the traceback
            with self.cond:
                self.error = e
                self.error_text = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
                self.cond.notify_all()
            return Phase.FAILED

    def _transition(self, block: bool) -> Phase:
        if self._stop:
            return Phase.STOPPED
        if self.next_step >= self.plan.num_steps:
            return Phase.FINISHED
        if self.next_step > self.acked + self.policy.lookahead_steps or (
                self.needs_consts and self.next_step not in self._fed_consts):
            if self._client_t0 is None:
                self._client_t0 = time.perf_counter()
            if block:
                with self.cond:
                    self.cond.wait_for(lambda: self._stop or (
                        self.next_step <= self.acked + self.policy.lookahead_steps and (
                            not self.needs_consts or self.next_step in self._fed_consts)),
                        timeout=0.5)
            return Phase.WAITING_FOR_CLIENT
        if self._wait_t0 is None:
            self._wait_t0 = time.perf_counter()
            self._occupancy_per_csx = self.feed.occupancy_per_csx()
            self._occupancy = sum(self._occupancy_per_csx) / max(len(self._occupancy_per_csx), 1)
            if self._client_t0 is not None:
                self._client_wait_s = self._wait_t0 - self._client_t0
                self._client_t0 = None
        inp = self.feed.take(timeout=0.2 if block else 0)
        if inp is None:
            self.feed.check_stall(self.next_step, time.perf_counter() - self._wait_t0)
            return Phase.WAITING_FOR_INPUT
        self._run_step(inp)
        return Phase.FINISHED if self.next_step >= self.plan.num_steps else Phase.READY

    def _run_step(self, inp: StepInput) -> None:
        step = self.next_step
        t0, t1 = self._wait_t0, time.perf_counter()
        self._wait_t0 = None
        leaves = inp.tensors
        samples = int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 1
        outputs = []
        if self.program is not None:
            if self.needs_consts:
                with self.cond:
                    values = self._fed_consts.pop(step)
                if values is not None:
                    self.program.consts = [c.to(self.device) for c in values]
            state = self.state.in_order(self.state_order)
            if self.runner is not None:
                outputs = self.runner(self.program, state, leaves, step)
            else:
                if self.device.type != "cpu":
                    leaves = [t.to(self.device) for t in leaves]
                outputs = self.program(state, leaves, step)
            self.state.update(self.state_order, state)
        floor_s = self.plan.min_step_seconds(samples // self.plan.num_csx)
        remaining = floor_s - (time.perf_counter() - t1)
        if remaining > 0:
            time.sleep(remaining)  # the simulated wafer's speed
        t2 = time.perf_counter()
        end_unix = time.time()
        with self.cond:
            if step > self.acked:  # the client can acknowledge steps before the wafer runs them
                self.outputs[step] = [o.detach() for o in outputs]
            if step in self.plan.checkpoint_steps:
                order = self.state_order or list(self.state.tensors)
                self.snapshots[step] = self.state.get(order)
                if self.rng is not None:
                    self.snapshots[step]["rng"] = self.rng.get_state()
                self.worker_states[step] = inp.worker_states or []
                if self.autoscaler is not None:
                    self.autoscale_states[step] = self.autoscaler.state_dict()
            record = {
                "step": step + 1, "samples": samples, "compute_s": t2 - t1,
                "wafer_t": t2 - self.t_start, "input_wait_s": t1 - t0,
                "client_wait_s": self._client_wait_s,
                "buffer_occupancy": self._occupancy,
                "buffer_occupancy_per_csx": list(self._occupancy_per_csx),
                "workers": [i.local_worker_id for i in inp.infos],
                "bytes": sum(i.nbytes for i in inp.infos),
                **_timeline_fields(inp.infos, end_unix),
            }
            if self.runner is not None and self.program is not None:
                self._awaiting_device[step] = record
                self._add_device_timings(block=False)
            else:
                self._record(record)
            self.done = step
            self.next_step = step + 1
            self._client_wait_s = 0.0
            if any(step >= s for s in self._awaited) or self.next_step >= self.plan.num_steps:
                self.cond.notify_all()

    # -- the client's side -------------------------------------------------------------------------
    def stop(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()

    def raise_if_failed(self) -> None:
        e = self.error
        if e is None:
            return
        if type(e).__module__.startswith("workers") or isinstance(e, BatchSpecError):
            raise e
        raise DriverError(f"the wafer failed while running: {self.error_text}")

    def _ack(self, step: int) -> None:
        if step <= self.acked:
            return
        self.acked = step
        for s in [s for s in self.outputs if s <= step]:
            del self.outputs[s]
        for s in [s for s in self.snapshots if s <= step]:
            del self.snapshots[s]
        self.cond.notify_all()

    def ack(self, step: int) -> int:
        """The client finished ``step``'s closures: its outputs and snapshot can go. A failure
        is raised where the client needs a step the wafer did not finish (collect, fetch,
        finish), so every finished step keeps its closures."""
        with self.cond:
            self._ack(step)
            return self.done

    def feed_consts(self, step: int, values: Optional[list]) -> None:
        """The plain-tensor arguments the client called ``step`` with (None: unchanged)."""
        with self.cond:
            self._fed_consts[step] = values
            self.cond.notify_all()

    def wait_done(self, step: int, timeout: Optional[float] = None,
                  alive: Callable[[], bool] = lambda: True) -> int:
        """Block until the wafer finished ``step`` (or failed, or stopped before it)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        with self.cond:
            while self.done < step:
                self.raise_if_failed()
                if self.phase.terminal or not alive():
                    self.raise_if_failed()
                    if self.done < step:
                        raise DriverError(f"the wafer stopped before step {step + 1}.")
                if deadline is not None and time.perf_counter() > deadline:
                    break
                self._wait_for_step(step, 0.2)
            return self.done

    def _wait_for_step(self, step: int, timeout: float) -> None:
        """Wait (holding :attr:`cond`) until ``step`` is finished, the loop ends or fails, or
        ``timeout`` seconds pass; the loop wakes this thread when it finishes ``step``."""
        self._awaited.append(step)
        try:
            self.cond.wait_for(lambda: self.done >= step or self.phase.terminal
                               or self.error is not None or self._stop, timeout=timeout)
        finally:
            self._awaited.remove(step)

    def take_stats(self) -> list:
        new = self.stats[self._stats_sent:]
        self._stats_sent = len(self.stats)
        return new

    def collect(self, since: int, until: int, indices: list, ack: int = -1,
                alive: Callable[[], bool] = lambda: True, more: int = 0) -> Collected:
        """Outputs ``indices`` of every step from ``since`` to the last one finished, once the
        wafer has finished ``until`` and then, if it gets there within
        ``policy.collect_more_s``, ``more`` steps after it (a client waiting for the wafer
        then makes one call for several steps); acknowledges ``ack`` first."""
        with self.cond:
            self._ack(ack)
        self.wait_done(until, alive=alive)
        with self.cond:
            target = min(until + more, self.acked + self.policy.lookahead_steps,
                         self.plan.num_steps - 1)
            if self.done < target:
                self._wait_for_step(target, self.policy.collect_more_s)
            first = max(since, self.acked + 1)
            steps = range(first, self.done + 1)
            values = [torch.stack([self.outputs[s][i] for s in steps]).to("cpu")
                      for i in indices] if len(steps) else []
            return Collected(self.done, first, values, self.take_stats())

    def fetch(self, step: int, indices: list, alive: Callable[[], bool] = lambda: True):
        """Outputs ``indices`` of one ``step`` (waits for it)."""
        self.wait_done(step, alive=alive)
        with self.cond:
            outs = self.outputs.get(step)
            if outs is None:
                raise DriverError(
                    f"the outputs of step {step + 1} are gone: the client acknowledged that step, "
                    "so the wafer dropped them. Read step outputs inside a step closure.")
            return [outs[i].to("cpu", copy=True) for i in indices], self.take_stats()
