"""A dataloader with the Cerebras RestartableDataLoader protocol (``state_dict`` /
``load_state_dict`` of the loader itself, ``aggregate_state_dict`` / ``deaggregate_state_dict``
across the input workers): ``DataLoader.state_dict()`` is the loader's aggregate and nothing
else, as on the Cerebras stack, and every worker of a resumed run loads its own deaggregation
of it, with one input worker or several."""

from __future__ import annotations

import pytest
import torch

import cstream as cstorch

BACKENDS = (("CPU", {}), ("CSX", {"in_process": True}), ("CSX", {"num_threads": 1}))


def checkpointed_run(input_fn, steps, state=None, *, features=1, unpack=lambda batch: batch,
                     checkpoint_steps=3, cs_config=None, save_before=False):
    """``steps`` steps of ``Linear(features, 1)`` over ``input_fn``'s batches (resumed from
    ``state`` if given): the first column of each step's input, and the dataloader state saved
    in a checkpoint closure every step (and before the run, with ``save_before``)."""
    dataloader = cstorch.utils.data.DataLoader(input_fn)
    assert dataloader.is_restartable
    if state is not None:
        dataloader.load_state_dict(state)
    compiled = cstorch.compile(torch.nn.Linear(features, 1), cstorch.current_backend())
    rows, saved = [], {}

    @cstorch.trace
    def step(batch):
        x = unpack(batch)
        return compiled(x).sum(), x[:, 0]

    @cstorch.step_closure
    def keep(_, column):
        rows.append(column.tolist())

    @cstorch.checkpoint_closure
    def save(i):
        saved[i] = dataloader.state_dict()

    if save_before:
        save(0)
    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=steps,
                                               checkpoint_steps=checkpoint_steps,
                                               cs_config=cs_config)
    for i, batch in enumerate(executor, 1):
        keep(*step(batch))
        save(i)
    return rows, saved


def first_of_each_step(rows):
    return [row[0] for row in rows]


class RestartableBatches:
    """The RestartableDataLoader protocol at its smallest: one worker's position, aggregated into
    a list of every worker's, the first of which is loaded on resume."""

    def __init__(self, n=8):
        self.n, self.next = n, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        while self.next < self.n:
            self.next += 1
            yield torch.full((2, 3), float(self.next - 1))
        self.next = 0

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state, strict=True):
        self.next = state["next"]

    def aggregate_state_dict(self, worker_states):
        return {"workers": worker_states}

    def deaggregate_state_dict(self, aggregated, strict=True):
        return aggregated["workers"][0]


def test_the_restartable_protocol_round_trips(ray_session):
    """A run saves the loader's state before it starts and at step 3; runs resumed from either
    stream from there, on every backend."""
    def run(steps, state=None):
        rows, saved = checkpointed_run(RestartableBatches, steps, state, features=3,
                                       save_before=True)
        return first_of_each_step(rows), saved

    for kind, options in BACKENDS:
        with cstorch.backend(kind, **options):
            firsts, saved = run(6)
            assert firsts == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], kind
            assert sorted(saved) == [0, 3, 6]
            assert saved[0] == {"workers": [{"next": 0}]}
            assert saved[3] == {"workers": [{"next": 3}]}
            assert run(3, saved[3])[0] == [3.0, 4.0, 5.0], kind
            assert run(2, saved[0])[0] == [0.0, 1.0], kind


class CountingSampler(torch.utils.data.Sampler):
    """Batches of 2 indices from a global sample count, as the Model Zoo's HDF5 sampler."""

    def __init__(self, n):
        self.n, self.start = n, 0

    def set_state(self, samples_streamed):
        self.start = samples_streamed

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, self.n, 2):
            yield [i, i + 1]

    def __len__(self):
        return self.n // 2


class SamplesStreamedLoader(torch.utils.data.DataLoader):
    """The Model Zoo's RestartableDataLoader (Release 2.2 HDF5 loaders): each worker's state is
    the samples it streamed in this run and those the run it resumed had streamed; the states
    are summed into the global count, which load_state_dict wants with the shuffle seed and
    nothing else."""

    def __init__(self):
        self.previous_samples_streamed = 0
        data = torch.arange(40.0).reshape(20, 2)
        super().__init__(torch.utils.data.TensorDataset(data),
                         batch_sampler=CountingSampler(20))

    def state_dict(self):
        return {"samples_streamed": cstorch.distributed.get_worker_state().samples_streamed,
                "previous_samples_streamed": self.previous_samples_streamed}

    def aggregate_state_dict(self, worker_states):
        return {"samples_streamed": sum(s["samples_streamed"] for s in worker_states)
                + worker_states[0]["previous_samples_streamed"], "seed": 0}

    def deaggregate_state_dict(self, aggregated):
        return aggregated

    def load_state_dict(self, state):
        if sorted(state) != ["samples_streamed", "seed"]:
            raise RuntimeError(f"The keys in state_dict must be 'samples_streamed' and 'seed', "
                               f"found {list(state)}")
        self.previous_samples_streamed = state["samples_streamed"]
        self.batch_sampler.set_state(state["samples_streamed"])


def test_a_loader_that_aggregates_worker_states_resumes_twice_where_it_stopped(ray_session):
    """The worker's samples_streamed counts this run's samples; a resumed run loads the
    aggregate, and a run resumed from the resumed run does not count the first part twice."""
    def run(steps, state=None):
        rows, saved = checkpointed_run(SamplesStreamedLoader, steps, state, features=2,
                                       unpack=lambda batch: batch[0], checkpoint_steps=2)
        return first_of_each_step(rows), saved

    for kind, options in BACKENDS:
        with cstorch.backend(kind, **options):
            firsts, saved = run(6)
            assert firsts == [0, 4, 8, 12, 16, 20], kind  # the first sample of each batch
            again, saved_again = run(4, saved[2])
            assert again == [8, 12, 16, 20], kind
            assert run(2, saved_again[2])[0] == [16, 20], kind




class ShardedSamples:
    """The Model Zoo's HDF5 streaming loaders (Release 2.10 ``HDF5IterableDataProcessor``): the
    samples are global batches of 2, shard ``s`` of ``n`` streams batches s, s + n, s + 2n...;
    a worker's state is its shard and the samples it streamed; the aggregate is every worker's
    state, sorted by shard, under one key; on resume the worker with the fewest samples streamed
    becomes worker 0, so the new run's round-robin starts where the old one stopped."""

    def __init__(self, batches=12):
        info = cstorch.distributed.get_worker_info()
        self.task_id, self.num_tasks = info.global_worker_id, info.total_num_workers
        self.batches = batches
        self.shard, self.skip, self.previous = self.task_id, 0, 0

    def __iter__(self):
        skip, self.skip = self.skip, 0
        for b in range(self.shard + skip * self.num_tasks, self.batches, self.num_tasks):
            yield torch.tensor([[2.0 * b], [2.0 * b + 1]])

    def state_dict(self):
        streamed = cstorch.distributed.get_worker_state().samples_streamed
        return {"samples_streamed": streamed + self.previous, "shard_index": self.shard}

    def load_state_dict(self, state):
        if sorted(state) != ["samples_streamed", "shard_index"]:
            raise RuntimeError(f"expected samples_streamed and shard_index, got {sorted(state)}")
        self.previous = state["samples_streamed"]
        self.shard, self.skip = state["shard_index"], state["samples_streamed"] // 2

    def aggregate_state_dict(self, worker_states):
        return {"all_worker_states": sorted(worker_states, key=lambda s: s["shard_index"])}

    def deaggregate_state_dict(self, aggregated):
        if list(aggregated) != ["all_worker_states"]:
            raise RuntimeError("The aggregated state dict must contain a single key "
                               f"'all_worker_states', found {list(aggregated)}")
        states = aggregated["all_worker_states"]
        if len(states) != self.num_tasks:
            raise RuntimeError(f"saved by {len(states)} workers, resumed by {self.num_tasks}")
        first = min(range(len(states)), key=lambda i: states[i]["samples_streamed"])
        return states[(self.task_id + first) % self.num_tasks]


def sharded_run(steps, workers, state=None):
    """The first sample of each step's batch, and the dataloader state saved every 3 steps."""
    rows, saved = checkpointed_run(
        ShardedSamples, steps, state,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
    return first_of_each_step(rows), saved


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("options", [{"in_process": True}, {"num_threads": 1}],
                         ids=["in_process", "ray"])
def test_every_worker_resumes_from_its_deaggregation_of_the_aggregate(ray_session, workers,
                                                                      options):
    """Saved at step 3 by 2 or 3 workers (the aggregate alone, as the Cerebras stack saves it),
    resumed by as many: the resumed run streams the uninterrupted run's batches from step 4."""
    with cstorch.backend("CSX", **options):
        firsts, saved = sharded_run(9, workers)
        assert firsts == [2 * b for b in range(9)]
        assert list(saved[3]) == ["all_worker_states"]
        streamed = {s["shard_index"]: s["samples_streamed"]
                    for s in saved[3]["all_worker_states"]}
        # step s came from worker (s - 1) % W: 2 samples a step
        assert streamed == {w: 2 * len(range(w, 3, workers)) for w in range(workers)}
        again, saved_again = sharded_run(6, workers, saved[3])
        assert again == firsts[3:]
        assert sharded_run(3, workers, saved_again[3])[0] == firsts[6:]


def test_an_aggregate_written_by_hand_resumes_as_one_the_run_saved(ray_session):
    """An aggregate from another program (a checkpoint of the real stack) is the same plain
    dict: every worker finds its shard in it."""
    aggregate = {"all_worker_states": [{"samples_streamed": 4, "shard_index": 0},
                                       {"samples_streamed": 2, "shard_index": 1}]}
    with cstorch.backend("CSX", num_threads=1):
        assert sharded_run(4, 2, aggregate)[0] == [6, 8, 10, 12]


def test_a_mismatched_aggregate_fails_with_the_loaders_own_message(ray_session):
    """A worker whose deaggregate_state_dict refuses the aggregate stops the run with that
    message, naming the input worker."""
    aggregate = {"all_worker_states": [{"samples_streamed": 4, "shard_index": 0}]}
    with cstorch.backend("CSX", num_threads=1):
        with pytest.raises(Exception, match="saved by 1 workers, resumed by 2"):
            sharded_run(2, 2, aggregate)


def test_a_foreign_state_for_a_loader_without_the_protocol_is_refused():
    """A state that is neither cstream's nor meant for a RestartableDataLoader: the message
    names what was given, what is expected and why this loader cannot take it."""
    def plain():
        return [torch.zeros(2, 1)] * 4

    dataloader = cstorch.utils.data.DataLoader(plain)
    with pytest.raises(ValueError, match=r"got dict with keys \['samples_streamed'\], and "
                                         r"input_fn .*plain's loader has no "
                                         r"deaggregate_state_dict"):
        dataloader.load_state_dict({"samples_streamed": 4})


class GlobalCountLoader(torch.utils.data.DataLoader):
    """The Model Zoo's map-style RestartableDataLoader (Release 2.10
    ``data/common/restartable_dataloader.py``): its batch_sampler is the Release 2.x
    ``DistributedSampler`` of global batches; a worker's state is the samples it streamed in
    this run; the aggregate is their sum with the resumed run's, and every worker loads the same
    aggregate: ``set_state(samples_streamed)`` puts the sampler at that global batch."""

    def __init__(self, n=48, batch_size=4):
        data = torch.arange(float(n)).reshape(n, 1)
        super().__init__(torch.utils.data.TensorDataset(data),
                         batch_sampler=cstorch.utils.data.DistributedSampler(
                             range(n), shuffle=True, seed=3, batch_size=batch_size))
        self.previous = 0

    def state_dict(self):
        return {"samples_streamed": cstorch.distributed.get_worker_state().samples_streamed,
                "previous_samples_streamed": self.previous}

    def aggregate_state_dict(self, worker_states):
        return {"samples_streamed": worker_states[0]["previous_samples_streamed"]
                + sum(s["samples_streamed"] for s in worker_states)}

    def deaggregate_state_dict(self, aggregated, strict=True):
        return aggregated

    def load_state_dict(self, state, strict=True):
        self.previous = state["samples_streamed"]
        self.batch_sampler.set_state(state["samples_streamed"])


def global_count_run(steps, workers, assignment, state=None):
    return checkpointed_run(
        GlobalCountLoader, steps, state, unpack=lambda batch: batch[0],
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers,
                                         input_assignment=assignment))


@pytest.mark.parametrize("assignment", ["dynamic", "static"])
def test_workers_of_a_global_batch_sampler_resume_at_the_aggregates_global_batch(
        ray_session, assignment):
    """Saved at step 3 by 2 workers and resumed by 2: every worker's sampler resumes at global
    batch 3, and step 4 comes from the worker the uninterrupted run took it from. The loader
    keeps the round-robin where dynamic assignment is asked for: each worker's state counts the
    batches it took, which the aggregate sums."""
    with cstorch.backend("CSX", num_threads=1):
        rows, saved = global_count_run(8, 2, assignment)
        assert saved[3] == {"samples_streamed": 12} and saved[6] == {"samples_streamed": 24}
        assert sorted(v for r in rows[:6] for v in r) != list(range(24))  # shuffled
        again, saved_again = global_count_run(5, 2, assignment, saved[3])
        assert again == rows[3:]
        assert saved_again[3] == saved[6]
        assert global_count_run(2, 2, assignment, saved_again[3])[0] == rows[6:]


def test_a_global_batch_sampler_resumes_from_the_aggregate_on_cpu():
    with cstorch.backend("CPU"):
        rows, saved = global_count_run(8, 1, "static")
        assert global_count_run(5, 1, "static", saved[3])[0] == rows[3:]
