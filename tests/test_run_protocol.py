"""The run interface: both runs implement every member of ``Run``; what only the CSX run offers
is asked for by name; the executor's closure queue."""

from __future__ import annotations

import inspect

import pytest
import torch

import cstream as cstorch
from executor.backends.base import Run
from executor.backends.cpu import EagerRun
from executor.backends.csx_run import CSXRun
from executor.data_executor import ClosureQueue

MEMBERS = sorted(n for n in vars(Run) if not n.startswith("_"))
METHODS = [n for n in MEMBERS if callable(vars(Run)[n])]


def test_the_protocol_names_the_calls_the_executor_makes():
    assert METHODS == ["autoscale_state", "checkpoint_reads", "close", "closure_reads",
                       "end_step", "materialize", "next_batch", "progress_stats",
                       "samples_in_step", "step_done", "wafer_stats", "worker_states"]
    assert "has_wafer" in Run.__annotations__


@pytest.mark.parametrize("run_class", [EagerRun, CSXRun])
def test_both_runs_implement_every_method_with_the_protocols_parameters(run_class):
    for name in METHODS:
        ours = inspect.signature(getattr(run_class, name))
        theirs = inspect.signature(getattr(Run, name))
        assert list(ours.parameters) == list(theirs.parameters), name
    assert isinstance(run_class.has_wafer, bool)


def _tiny_input_fn():
    return [(torch.full((4, 2), float(i)),) for i in range(3)]


def test_an_eager_run_says_it_has_no_wafer_and_the_executor_shows_its_run_only_while_iterated():
    cstorch.backend("CPU")
    ex = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(_tiny_input_fn),
                                         num_steps=2)
    seen = []
    assert ex.run is None
    for _ in ex:
        run = ex.run
        seen.append((run.has_wafer, run.wafer_stats(), run.progress_stats(ex.iteration)))
    assert seen == [(False, None, None)] * 2
    assert ex.run is None


def test_closures_run_in_call_order_and_a_run_without_values_keeps_only_checkpoint_closures():
    q = ClosureQueue()
    q.add(print, ("step 1",), {})
    mark = q.mark()
    q.add(print, ("step 2",), {})
    q.add(print, ("checkpoint 2",), {}, checkpoint=True)
    assert [c.args[0] for c in q.take_since(mark)] == ["step 2", "checkpoint 2"]
    q.add(print, ("checkpoint 3",), {}, checkpoint=True)
    q.add(print, ("step 3",), {})
    q.add(print, ("checkpoint 4",), {}, checkpoint=True)
    q.drop_step_closures()
    assert [(c.args[0], c.kind) for c in q.take_all()] == [
        ("checkpoint 3", "checkpoint closure"), ("checkpoint 4", "checkpoint closure")]
    assert len(q) == 0
