"""The dry runs of the CSX backend: ``validate_only`` traces the step and checks it,
``compile_only`` also compiles it on the wafer; neither runs a step.

A dry run is the client's side of :class:`~executor.backends.csx_run.CSXRun` up to the launch:
the input workers start (the batch spec comes from them), the first call of the traced step is
captured, and then nothing is sent to the wafer to run. The executor runs one step
(``Backend.forces_single_step``); step closures are dropped, as nothing they could read exists.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Optional

import torch

from executor.backends.csx_run import CSXRun, validation_report
from executor.engine.capture import Captured

log = logging.getLogger("cstream")


class DryRun(CSXRun):
    """A run that captures the step and stops before the wafer runs it."""

    def _launch(self, cap: Captured, consts: list) -> None:
        raise NotImplementedError

    def _launch_without_model(self) -> None:
        self.started = True  # no step to check or compile

    def _send_consts(self, step: int, sent: Optional[list]) -> None:
        pass  # no step runs to read them

    def end_step(self, step: int) -> dict:
        summary = super().end_step(step)
        self.context.closures.drop_step_closures()
        return summary

    def step_done(self, step: int) -> None:
        pass  # the wafer runs nothing to be told of

    def read_output(self, slot) -> torch.Tensor:
        raise RuntimeError("the backend was created with compile_only/validate_only: nothing "
                           "runs, so step outputs have no values.")

    @contextlib.contextmanager
    def closure_reads(self, step: int):
        yield

    @contextlib.contextmanager
    def checkpoint_reads(self, step: int):
        yield

    def rng_state(self) -> torch.Tensor:
        self._closure_step()  # the same rule as a run: only inside a checkpoint closure
        return torch.get_rng_state()

    def progress_stats(self, step: int) -> Optional[dict]:
        return None

    def _finish(self, ok: bool) -> dict:
        self.driver.finish(wait=False)
        return {}


class ValidateOnlyRun(DryRun):
    """``validate_only``: the captured step's ops and the ops tied to another device (on a CUDA
    wafer, its CUDA graph's plan) are the run's compile report; nothing is compiled."""

    def _launch(self, cap: Captured, consts: list) -> None:
        self.started = True
        self.compile_report = validation_report(cap, consts, self.backend.options,
                                                self._device_bound_ops(cap))
        log.info("validate_only: traced %d ops; nothing compiled or run", cap.num_ops)


class CompileOnlyRun(DryRun):
    """``compile_only``: the step is compiled on the wafer against its state's specs (the
    weights were dropped); nothing runs."""

    def _launch(self, cap: Captured, consts: list) -> None:
        self.started = True
        self._compile(cap, consts, compile_only=True)
        log.info("compile_only: compiled; nothing run")
