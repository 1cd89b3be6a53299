"""What the Model Zoo 2.10 Trainer reads from the objects ``cerebras.pytorch`` gives it, beyond
the names it imports: the attributes and methods its callbacks and loggers call on a backend, its
cluster, a compiled model, a DataLoader and a SummaryWriter, with the values the real
cerebras-pytorch 2.10 gives them (learned from the real package; its own code is not used)."""

from __future__ import annotations

import os

import pytest
import torch

import cerebras.pytorch as cstorch
from cstream.unsupported import UnsupportedFeatureError


def test_a_compiled_module_says_its_device_and_the_backend_is_its_own_implementation():
    """The Trainer's norm callbacks build tensors on ``model.device``; its progress logger
    reads ``trainer.backend._impl.is_e2e_execution``."""
    backend = cstorch.backend("CPU")
    model = torch.nn.Linear(2, 1)
    cstorch.compile(model, backend)
    assert model.device == torch.device("cpu")
    assert backend._impl is backend and backend._impl.is_e2e_execution is True
    assert cstorch.backend() is backend


def test_a_csx_cluster_starts_and_stops_one_workflow_at_a_time():
    backend = cstorch.backend("CSX")
    cluster = backend.cluster
    assert cluster.workflow_id is None and backend.appliance is None
    assert cluster.start_workflow(lock_resources=False) is True
    first = cluster.workflow_id
    assert first.startswith("wf-") and cluster.config.workflow_id == first
    assert cluster.start_workflow() is False and cluster.workflow_id == first
    cluster.stop_workflow()
    assert cluster.workflow_id is None


def test_a_workflow_id_given_in_the_cluster_config_is_kept_when_a_run_stops():
    backend = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(
        workflow_id="wf-given"))
    assert backend.cluster.start_workflow() is False
    backend.cluster.stop_workflow()
    assert backend.cluster.workflow_id == "wf-given"


def test_checkpoints_in_s3_are_refused_naming_the_setting():
    backend = cstorch.backend("CSX")
    with pytest.raises(UnsupportedFeatureError, match="local path"):
        backend.cluster.check_storage_connectivity()


def _batches(n):
    return [torch.full((2, 1), float(i)) for i in range(n)]


def test_a_dataloader_has_an_id_of_its_own_and_the_clients_loader():
    first, second = cstorch.utils.data.DataLoader(_batches, 3), \
        cstorch.utils.data.DataLoader(_batches, 3)
    assert isinstance(first.id, int) and second.id == first.id + 1
    assert [float(b[0, 0]) for b in first.dataloader] == [0.0, 1.0, 2.0]
    assert first.dataloader is first.dataloader  # built once, as the real package's


SEEN: list = []  # the calls of the loaders below (their arguments are copies, not shared)


class _StrictLoader:
    """A RestartableDataLoader whose load methods take ``strict`` (Release 2.5's protocol)."""

    def __init__(self):
        self.seen, self.position = SEEN, 0

    def __iter__(self):
        while self.position < 6:
            self.position += 1
            yield torch.full((1, 1), float(self.position))

    def __len__(self):
        return 6

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state, strict=True):
        self.seen.append(("load", strict))
        self.position = state["position"]

    def aggregate_state_dict(self, states):
        return states[0]

    def deaggregate_state_dict(self, state, strict=True):
        self.seen.append(("deaggregate", strict))
        return state


def _run(loader, steps, checkpoint_at=None):
    states, values = {}, []
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=steps,
                                               checkpoint_steps=checkpoint_at)
    for step, batch in enumerate(executor, 1):
        values.append(float(batch[0, 0]))
        if step == checkpoint_at:
            states["loader"] = loader.state_dict()
    return values, states


@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_passes_strict_to_a_loader_that_takes_it(strict):
    backend = cstorch.backend("CPU")  # noqa: F841  (the executor runs on it)
    SEEN.clear()
    loader = cstorch.utils.data.DataLoader(_StrictLoader)
    values, states = _run(loader, 4, checkpoint_at=2)
    assert values == [1.0, 2.0, 3.0, 4.0]
    resumed = cstorch.utils.data.DataLoader(_StrictLoader)
    resumed.load_state_dict(states["loader"], strict=strict)
    assert _run(resumed, 2)[0] == [3.0, 4.0]
    assert SEEN == [("deaggregate", strict), ("load", strict)]


def test_strict_must_be_a_bool():
    loader = cstorch.utils.data.DataLoader(_batches, 3)
    with pytest.raises(TypeError, match="expected True or False"):
        loader.load_state_dict({}, strict="yes")


def test_a_summary_writer_keeps_cerebras_events_beside_its_event_file(tmp_path):
    writer = cstorch.utils.tensorboard.SummaryWriter(str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2 and writer.cs_events_dir.is_dir()
    tf_events, = [n for n in names if n.startswith("events.out.tfevents.")]
    assert writer.cs_events_dir.name == tf_events.replace("tfevents", "csevents")
    writer.close()
