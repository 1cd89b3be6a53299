"""The Ray input side: InputWorker actors and CsxInputStream (real Ray, tiny data)."""

from __future__ import annotations

import collections
import json
import os
import pickle
import threading
import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, Sampler

from workers import CSConfig, get_worker_info
from workers.context import get_worker_state
from workers.dataloader import DataLoader, EmptyDataLoaderError
from workers.errors import (
    InputWorkerError,
    StragglerWarning,
    UnshardedInputWarning,
    WorkerCrashLoopError,
)
from workers.flow import FlowPolicy
from workers.stream import CsxInputStream, kill_workers, start_workers_ahead

FLOW = FlowPolicy(small_reply_batches=1)
"""The streams' flow policy: replies carry at most ``batches_per_fetch`` batches whatever their
size, so the bounds these tests count in batches hold exactly."""

Pair = collections.namedtuple("Pair", ["features", "label"])


# -- input functions (run inside the worker actors) ---------------------------------------------
def identity_fn(num_batches):
    info = get_worker_info()

    class Batches:  # iterated lazily, so get_worker_state() reports the position of each batch
        def __iter__(self):
            for _ in range(num_batches):
                st = get_worker_state()
                yield torch.tensor([info.local_worker_id, info.num_workers_per_csx, info.num_csx,
                                    info.wse_id, info.global_worker_id, info.total_num_workers,
                                    st.worker_step])

    return Batches()


def _perm(n, epoch):
    return torch.randperm(n, generator=torch.Generator().manual_seed(1234 + epoch)).tolist()


class ShardOfIds(Dataset):
    """Sample ids ``g, g + G, g + 2G, ...`` of this worker; counts the samples it loaded."""

    def __init__(self, num_samples):
        info = get_worker_info()
        self.ids = list(range(num_samples))[info.global_worker_id::info.total_num_workers]
        self.loaded = 0

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        self.loaded += 1
        return {"id": self.ids[i], "loaded": self.loaded}


class EpochShuffledSampler(Sampler):
    """Shuffles per epoch (``set_epoch``); no state_dict, so a resume skips batches."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(_perm(self.n, self.epoch))

    def __len__(self):
        return self.n


class RestartableSampler(EpochShuffledSampler):
    """Also has state_dict/load_state_dict: a resume restores its position directly."""

    def __init__(self, n):
        super().__init__(n)
        self.pos, self.start = 0, 0

    def __iter__(self):
        order = _perm(self.n, self.epoch)
        start, self.start = self.start, 0
        for i in range(start, self.n):
            self.pos = i + 1
            yield order[i]

    def state_dict(self):
        return {"pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state):
        assert state["epoch"] == self.epoch, (state, self.epoch)
        self.start = state["pos"]


def ids_fn(num_samples, batch_size, sampler="none"):
    ds = ShardOfIds(num_samples)
    kinds = {"none": None, "shuffled": EpochShuffledSampler, "restartable": RestartableSampler}
    smp = kinds[sampler](len(ds)) if kinds[sampler] else None
    return TorchDataLoader(ds, batch_size=batch_size, sampler=smp)


def expected_ids(num_samples, batch_size, num_workers, steps, shuffled, wse_id=0, num_csx=1):
    """The ids of steps 0..steps-1 of one CS-X, computed without cstream."""
    out = []
    for s in range(steps):
        w, k = s % num_workers, s // num_workers
        g = wse_id * num_workers + w
        shard = list(range(num_samples))[g::num_workers * num_csx]
        per_epoch = -(-len(shard) // batch_size)
        epoch, b = divmod(k, per_epoch)
        order = _perm(len(shard), epoch) if shuffled else list(range(len(shard)))
        out.append([shard[i] for i in order[b * batch_size:(b + 1) * batch_size]])
    return out


def structures_fn():
    return [{
        "pair": Pair(torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4,
                     torch.tensor([1, -2], dtype=torch.int64)),
        "mixed": (torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
                  [torch.tensor([True, False, True]), torch.tensor(7, dtype=torch.int8)]),
        "half": torch.tensor([[0.5, 1.0]], dtype=torch.float16),
        "strided": torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        "name": "batch",
    }]


def same_tensor_fn():
    t = torch.arange(4, dtype=torch.float32)
    return [{"x": t, "y": t.to(torch.bfloat16)}] * 3


def counting_fn(path):
    def gen():
        produced = 0
        while True:
            produced += 1
            with open(path, "w") as f:
                f.write(str(produced))
            yield torch.full((2,), produced)

    class Forever:
        def __iter__(self):
            return gen()

    return Forever()


def unsharded_fn():
    return [torch.arange(8).reshape(2, 4) + i for i in range(3)]


def failing_construction_fn():
    if get_worker_info().local_worker_id == 1:
        raise ValueError("no shard for worker 1: the manifest lists 0 files")
    return [torch.zeros(2)] * 4


def failing_iteration_fn():
    def gen():
        for i in range(10):
            if i == 2:
                raise KeyError("sample 17 has no 'label' column")
            yield torch.tensor([i])

    class It:
        def __iter__(self):
            return gen()

    return It()


def empty_fn():
    return []


def wait_for_file(path, timeout_s=120.0):
    """Block until ``path`` exists (the test creates it), for at most ``timeout_s``."""
    deadline = time.time() + timeout_s
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)


def crashing_fn(marker):
    def gen():
        for i in range(10):
            if i == 2:
                wait_for_file(marker)  # the consumer has batches 0 and 1
                os._exit(3)  # the worker's process dies, as on an out-of-memory kill
            yield torch.tensor([i])

    class It:
        def __iter__(self):
            return gen()

    return It()


def slow_fn(marker):
    def slow_batches():
        yield torch.tensor([0])
        wait_for_file(marker)  # until the stream has reported this worker as a straggler
        yield torch.tensor([1])

    class It:
        def __iter__(self):
            return slow_batches()

    return It()


# -- helpers -------------------------------------------------------------------------------------
def live_actors(ray, prefix):
    return sorted(n for n in ray.util.list_named_actors() if n.startswith(prefix + "-"))


def wait_actors_gone(ray, prefix, timeout=10.0):
    deadline = time.time() + timeout
    while live_actors(ray, prefix) and time.time() < deadline:
        time.sleep(0.1)
    return live_actors(ray, prefix)


def take_ids(stream, n):
    return [stream.next()[0]["id"].tolist() for _ in range(n)]


# -- tests ----------------------------------------------------------------------------------------
def test_input_fn_sees_its_csx_and_worker_for_every_layout(ray_session):
    streams = [(CSConfig(num_csx=C, num_workers_per_csx=W), c) for C, W in [(2, 2)]
               for c in range(C)]
    streams = [(cfg, c, CsxInputStream(DataLoader(identity_fn, 2), cfg, c, policy=FLOW,
                                       name_prefix=f"info{cfg.num_csx}"))
               for cfg, c in streams]
    try:
        for cfg, c, s in streams:
            W, C = cfg.num_workers_per_csx, cfg.num_csx
            got = [s.next()[0].tolist() for _ in range(2 * W)]
            # local id, workers per CS-X, CS-Xs, CS-X, global id, total workers, worker_step
            assert got == [[k % W, W, C, c, c * W + k % W, C * W, k // W] for k in range(2 * W)]
    finally:
        for _, _, s in streams:
            s.close()


def test_a_stream_takes_the_workers_started_ahead_and_replaces_one_that_died(ray_session):
    ray = ray_session
    cfg = CSConfig(num_csx=2, num_workers_per_csx=2)
    ahead = start_workers_ahead(cfg, name_prefix="ahead")
    pids = [[ray.get(a.pid.remote()) for a in row] for row in ahead]
    dead = ahead[0][1]
    ray.kill(dead, no_restart=True)
    with CsxInputStream(DataLoader(identity_fn, 2), cfg, 0, policy=FLOW, name_prefix="ahead",
                        workers_ahead=ahead[0]) as s:
        assert ahead[0] == [None, None]  # taken: set up, or killed and replaced
        got = [s.next()[0].tolist() for _ in range(4)]
        used = [ray.get(wk.actor.pid.remote()) for wk in s.workers]
    # local id, workers per CS-X, CS-Xs, CS-X, global id, total workers, worker_step
    assert got == [[k % 2, 2, 2, 0, k % 2, 4, k // 2] for k in range(4)]
    assert used[0] == pids[0][0]  # the worker started ahead
    assert used[1] != pids[0][1]  # a new worker in place of the dead one
    assert ahead[1] != [None, None]  # CS-X 1's row was not given to this stream
    kill_workers(ahead)
    deadline = time.time() + 60  # ray.kill acts asynchronously: a call may still get through
    with pytest.raises(ray.exceptions.RayActorError):
        while time.time() < deadline:
            ray.get(ahead[1][0].pid.remote(), timeout=60)
            time.sleep(0.1)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_batches_arrive_in_round_robin_order_with_the_exact_sample_ids(ray_session, workers):
    cfg = CSConfig(num_workers_per_csx=workers)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnshardedInputWarning)
        with CsxInputStream(DataLoader(ids_fn, 24, 2), cfg, 0, policy=FLOW,
                            name_prefix=f"rr{workers}") as s:
            infos = []
            got = []
            for _ in range(4 * workers):
                batch, info = s.next()
                got.append(batch["id"].tolist())
                infos.append((info.local_worker_id, info.worker_step, info.nbytes))
            stats = s.stats()
    # 24 ids over `workers` shards of batch 2: 12 / workers batches per epoch, then a new epoch
    assert got == expected_ids(24, 2, workers, 4 * workers, shuffled=False)
    assert infos == [(k % workers, k // workers, 32) for k in range(4 * workers)]
    assert [w["batches"] for w in stats["workers"]] == [4] * workers
    assert stats["steps"] == 4 * workers and stats["restarts"] == 0


def test_nested_structures_and_dtypes_round_trip_exactly(ray_session):
    with CsxInputStream(DataLoader(structures_fn), CSConfig(), 0, policy=FLOW,
                        name_prefix="nest") as s:
        spec = s.peek_spec()
        batch, info = s.next()
    want = structures_fn()[0]
    assert isinstance(batch["pair"], Pair) and isinstance(batch["mixed"], tuple)
    assert isinstance(batch["mixed"][1], list) and batch["name"] == "batch"
    pairs = [(batch["pair"].features, want["pair"].features),
             (batch["pair"].label, want["pair"].label),
             (batch["mixed"][0], want["mixed"][0]), (batch["mixed"][1][0], want["mixed"][1][0]),
             (batch["mixed"][1][1], want["mixed"][1][1]), (batch["half"], want["half"]),
             (batch["strided"], want["strided"])]
    for got, exp in pairs:
        assert got.dtype == exp.dtype and got.shape == exp.shape
        assert torch.equal(got, exp)
    assert batch["mixed"][0].tolist() == [1.5, -2.25, 3.0]
    assert spec["mixed"][0].dtype == torch.bfloat16 and spec["mixed"][0].device.type == "meta"
    assert isinstance(spec["pair"], Pair) and spec["pair"].features.shape == (2, 3)
    assert info.nbytes == 24 + 16 + 6 + 3 + 1 + 4 + 48


def test_mutating_a_returned_tensor_in_place_does_not_change_other_batches(ray_session):
    with CsxInputStream(DataLoader(same_tensor_fn), CSConfig(), 0, policy=FLOW,
                        name_prefix="mut") as s:
        first, _ = s.next()
        first["x"].add_(100)
        first["y"].mul_(0)
        second, _ = s.next()
        third, _ = s.next()
    assert first["x"].tolist() == [100.0, 101.0, 102.0, 103.0]
    for b in (second, third):
        assert b["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert b["y"].dtype == torch.bfloat16 and b["y"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("per_fetch,ahead", [(1, 5), (2, 6)])
def test_a_producer_never_runs_more_than_a_bounded_number_of_batches_ahead(ray_session, tmp_path,
                                                                          per_fetch, ahead):
    path = str(tmp_path / "produced")

    def produced_when_settled(at_least):
        """The count produced once it reached ``at_least`` (however long a loaded machine takes)
        and then stayed put for 0.8 s. A busy machine can only end the wait early, which
        reads a count too low to break the upper bound, never one too high."""
        last, stable_since = None, time.time()
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with open(path) as f:
                    now = int(f.read() or 0)
            except (FileNotFoundError, ValueError):
                now = None
            if now != last:
                last, stable_since = now, time.time()
            elif now is not None and now >= at_least and time.time() - stable_since > 0.8:
                return now
            time.sleep(0.05)
        return last

    with CsxInputStream(DataLoader(counting_fn, path), CSConfig(), 0, name_prefix=f"bp{per_fetch}",
                        policy=FlowPolicy(requests_in_flight_per_worker=2,
                                          batches_per_fetch=per_fetch, small_reply_batches=1)) as s:
        # one batch per reply: 2 replies in flight + 2 buffered in the worker + 1 waiting to
        # be buffered; up to 2 per reply: 1 left of the last reply + 1 reply of up to 2 in
        # flight + 2 buffered + 1 waiting
        assert s.max_batches_ahead == ahead
        # with several batches a reply, timing decides how many are left of the last reply
        # (0 to per_fetch - 1) and how many the reply in flight carries (1 to per_fetch)
        slack = 2 * (per_fetch - 1)
        got = [s.next()[0][0].item() for _ in range(3)]
        assert got == [1, 2, 3]
        assert 3 + ahead - slack <= produced_when_settled(3 + ahead - slack) <= 3 + ahead
        got = [s.next()[0][0].item() for _ in range(10)]
        assert got == list(range(4, 14))
        assert 13 + ahead - slack <= produced_when_settled(13 + ahead - slack) <= 13 + ahead


@pytest.mark.parametrize("sampler", ["shuffled", "restartable"])
def test_a_stream_resumed_from_worker_states_continues_the_exact_sequence(ray_session, sampler):
    cfg = CSConfig(num_workers_per_csx=2)
    loader = DataLoader(ids_fn, 20, 4, sampler)  # 10 ids per worker: batches of 4, 4, 2
    with CsxInputStream(loader, cfg, 0, policy=FLOW, name_prefix=f"res-{sampler}0") as s:
        got = take_ids(s, 7)
        states = s.worker_states()
    # worker 0 is inside epoch 1, worker 1 exactly at the end of epoch 0
    assert [(st.worker_step, st.samples_streamed, st.appliance_step) for st in states] == [
        (4, 14, 7), (3, 10, 7)]
    pos = [{k: st.user_state_dict[k] for k in ("epoch", "batch_in_epoch")} for st in states]
    assert pos == [{"epoch": 1, "batch_in_epoch": 1}, {"epoch": 0, "batch_in_epoch": 3}]
    if sampler == "restartable":
        assert [st.user_state_dict["loader_state"] for st in states] == [
            {"pos": 4, "epoch": 1}, {"pos": 10, "epoch": 0}]
        assert states[0].user_state_dict["loader_state_of"] == "sampler"
    else:
        assert "loader_state" not in states[0].user_state_dict
    json.dumps([st.user_state_dict for st in states])  # plain types, storable in HDF5

    with CsxInputStream(loader, cfg, 0, policy=FLOW, resume_states=states,
                        name_prefix=f"res-{sampler}1") as s:
        batches = [s.next() for _ in range(8)]
    assert [info.local_worker_id for _, info in batches][:2] == [1, 0]
    got += [b["id"].tolist() for b, _ in batches]
    assert got == expected_ids(20, 4, 2, 15, shuffled=True)
    # samples each worker's dataset had loaded by its first batch after the resume: a restored
    # sampler loads only that batch, a plain one re-reads the skipped batches first
    loaded = {}
    for b, info in batches:
        loaded.setdefault(info.local_worker_id, b["loaded"].tolist()[-1])
    assert loaded == ({0: 4, 1: 4} if sampler == "restartable" else {0: 8, 1: 14})


def test_identical_first_batches_of_all_workers_are_found_by_content(ray_session):
    from workers.duplicates import check_streams

    with CsxInputStream(DataLoader(unsharded_fn), CSConfig(num_workers_per_csx=2), 0, policy=FLOW,
                        name_prefix="unsh") as s:
        report = check_streams([s], "unsharded_fn", "warn")
        # the compared batches stay queued: the stream goes on from its first batch
        assert [s.next()[0][0, 0].item() for _ in range(4)] == [0, 0, 1, 1]
    assert (report.times, report.by, report.workers) == (2, "content", [(0, 0), (0, 1)])
    msg = report.message
    assert msg.startswith("input_fn unsharded_fn streams the same samples on 2 input workers "
                          "(CS-X 0 worker 0, CS-X 0 worker 1): 2 of the 2 batches (compared by "
                          "content) in their first 2 batch(es) were streamed by more than one "
                          "worker, so each of those samples is streamed 2 times")
    assert "cstream.utils.data.ShardedSampler" in msg
    assert "cstream.distributed.get_worker_info()" in msg


def test_input_fn_raising_at_construction_names_the_worker_and_keeps_the_traceback(ray_session):
    s = CsxInputStream(DataLoader(failing_construction_fn), CSConfig(num_workers_per_csx=2), 0,
                       policy=FLOW,
                       name_prefix="badctor")
    s.next()
    with pytest.raises(InputWorkerError) as ei:
        s.next()
    msg = str(ei.value)
    assert msg.startswith("CS-X 0, input worker 1 of 2, global batch 1 (step 2, the worker's "
                          "batch 0): input_fn failed while building its dataloader: ValueError: "
                          "no shard for worker 1: the "
                          "manifest lists 0 files\n")
    assert 'raise ValueError("no shard for worker 1: the manifest lists 0 files")' in msg
    assert "in failing_construction_fn" in msg
    assert (ei.value.wse_id, ei.value.local_worker_id, ei.value.exc_type) == (0, 1, "ValueError")
    assert str(pickle.loads(pickle.dumps(ei.value))) == msg  # crosses process boundaries intact
    assert wait_actors_gone(ray_session, "badctor") == []


def test_input_fn_raising_mid_iteration_surfaces_at_that_batch(ray_session):
    s = CsxInputStream(DataLoader(failing_iteration_fn), CSConfig(), 0, policy=FLOW,
                       name_prefix="baditer")
    assert [s.next()[0].item() for _ in range(2)] == [0, 1]
    with pytest.raises(InputWorkerError) as ei:
        s.next()
    msg = str(ei.value)
    assert msg.startswith("CS-X 0, input worker 0 of 1, global batch 2 (step 3, the worker's "
                          "batch 2): input_fn failed while producing this batch: KeyError: "
                          "\"sample 17 has no 'label' column\"")
    # the user's traceback, without the input worker's own frames
    assert "input_fn's traceback, in the input worker:\nTraceback (most recent call last):" in msg
    assert "workers/" not in msg and "ray::" not in msg
    assert "raise KeyError(\"sample 17 has no 'label' column\")" in msg
    assert wait_actors_gone(ray_session, "baditer") == []
    with pytest.raises(RuntimeError, match="the input stream of CS-X 0 is closed"):
        s.next()


def test_an_input_fn_that_yields_nothing_is_a_clear_error(ray_session):
    s = CsxInputStream(DataLoader(empty_fn), CSConfig(), 0, policy=FLOW, name_prefix="empty")
    with pytest.raises(EmptyDataLoaderError, match=r"^CS-X 0, input worker 0: input_fn empty_fn "
                                                   r"returned a dataloader that yields no batch"):
        s.peek_spec()
    assert wait_actors_gone(ray_session, "empty") == []


@pytest.mark.parametrize("per_fetch", [1, 4])
def test_a_killed_worker_is_restarted_without_losing_or_repeating_a_sample(ray_session,
                                                                         per_fetch):
    cfg = CSConfig(num_workers_per_csx=2, max_worker_restarts=2)
    # at the kill worker 1 has delivered at most 2 + 3 (rest of a reply) + 4 (a reply in
    # flight) of the 16 batches asked of it, so the stream must restart it
    with CsxInputStream(DataLoader(ids_fn, 64, 2), cfg, 0, name_prefix=f"kill{per_fetch}",
                        policy=FlowPolicy(requests_in_flight_per_worker=3,
                                          batches_per_fetch=per_fetch, small_reply_batches=1)) as s:
        got = take_ids(s, 5)
        ray_session.kill(ray_session.get_actor(f"kill{per_fetch}-csx0-w1"))
        got += take_ids(s, 27)
        stats = s.stats()
    assert got == expected_ids(64, 2, 2, 32, shuffled=False)
    assert [w["restarts"] for w in stats["workers"]] == [0, 1]
    assert [w["worker_step"] for w in stats["workers"]] == [16, 16]


def test_a_worker_that_keeps_dying_stops_the_stream_with_a_crash_loop_error(ray_session,
                                                                            tmp_path):
    cfg = CSConfig(max_worker_restarts=1)
    marker = tmp_path / "batches-0-and-1-received"
    s = CsxInputStream(DataLoader(crashing_fn, str(marker)), cfg, 0, policy=FLOW, name_prefix="loop")
    assert [s.next()[0].item() for _ in range(2)] == [0, 1]
    marker.touch()  # now the worker dies at batch 2, and again after its restart
    with pytest.raises(WorkerCrashLoopError) as ei:
        s.next()
    msg = str(ei.value)
    assert msg.startswith("CS-X 0, input worker 0 died 2 times, more than "
                          "CSConfig.max_worker_restarts=1 allows")
    assert "Last cause: ActorDiedError" in msg
    assert str(pickle.loads(pickle.dumps(ei.value))) == msg
    assert wait_actors_gone(ray_session, "loop") == []


def test_a_straggler_is_reported_with_its_stack_and_the_stream_keeps_waiting(ray_session,
                                                                            tmp_path):
    # the worker holds batch 1 until the stream has warned about it: however slow the machine,
    # the stream waits past straggler_timeout_s, reports, and then still gets the batch
    cfg = CSConfig(straggler_timeout_s=0.5)
    marker = tmp_path / "reported"

    def release_after_the_warning(rec, done):
        deadline = time.time() + 120
        while not done.is_set() and time.time() < deadline:
            if any(issubclass(w.category, StragglerWarning) for w in list(rec)):
                break
            time.sleep(0.01)
        marker.touch()

    with CsxInputStream(DataLoader(slow_fn, str(marker)), cfg, 0, policy=FLOW,
                        name_prefix="slow") as s:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StragglerWarning)  # a slow actor start may count
            assert s.next()[0].item() == 0
        done = threading.Event()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always", StragglerWarning)
            releaser = threading.Thread(target=release_after_the_warning, args=(rec, done))
            releaser.start()
            try:
                batch, info = s.next()
            finally:
                done.set()
                releaser.join()
        stats = s.stats()
    rec = [w for w in rec if issubclass(w.category, StragglerWarning)]
    assert batch.item() == 1 and len(rec) >= 1
    msg = str(rec[0].message)
    assert msg.startswith("CS-X 0, input worker 0 is a straggler: it has delivered nothing for ")
    assert "in slow_batches" in msg and "wait_for_file(marker)" in msg
    reports = [r for r in stats["stragglers"] if r["step"] == 1]
    assert len(reports) == len(rec)
    assert (reports[0]["local_worker_id"], reports[0]["worker_step"]) == (0, 1)
    assert reports[0]["waited_s"] >= cfg.straggler_timeout_s
    assert "wait_for_file(marker)" in reports[0]["stack"]
    # the step's wait covers every report made during it: the stream kept waiting
    assert info.wait_s >= reports[-1]["waited_s"] - 1e-3
    assert stats["workers"][0]["straggler_reports"] == len(stats["stragglers"])


def test_close_kills_every_actor_and_can_be_called_twice(ray_session):
    s = CsxInputStream(DataLoader(ids_fn, 8, 2), CSConfig(num_workers_per_csx=2), 0,
                       policy=FLOW, name_prefix="closing")
    assert live_actors(ray_session, "closing") == ["closing-csx0-w0", "closing-csx0-w1"]
    assert take_ids(s, 1) == [[0, 2]]
    states = s.worker_states()
    s.close()
    s.close()
    with pytest.raises(RuntimeError, match="is closed"):
        s.next()
    # the names are free again at once: a new stream under the same prefix picks up from there
    with CsxInputStream(DataLoader(ids_fn, 8, 2), CSConfig(num_workers_per_csx=2), 0,
                        policy=FLOW, resume_states=states, name_prefix="closing") as again:
        assert take_ids(again, 2) == [[1, 3], [4, 6]]
    assert wait_actors_gone(ray_session, "closing") == []


def test_bad_arguments_are_refused_with_the_rule_and_the_fix(ray_session):
    dl = DataLoader(ids_fn, 8, 2)
    with pytest.raises(TypeError, match="dataloader must be a cstream DataLoader"):
        CsxInputStream(ids_fn, CSConfig(), 0, policy=FLOW)
    with pytest.raises(ValueError, match=r"wse_id=2 is not a CS-X of this cluster; it must be an "
                                         r"int in \[0, 2\)"):
        CsxInputStream(dl, CSConfig(num_csx=2), 2, policy=FLOW)
    with pytest.raises(TypeError, match=r"policy must be a FlowPolicy, got NoneType: None\. Build "
                                        r"the run's with workers\.flow\.FlowPolicy\.from_config"):
        CsxInputStream(dl, CSConfig(), 0, policy=None)
    with pytest.raises(ValueError, match=r"FlowPolicy\.requests_in_flight_per_worker: expected a "
                                         r"positive int, got 0\. Set it to 1 or more\."):
        FlowPolicy(requests_in_flight_per_worker=0)
    with pytest.raises(ValueError, match=r"must hold one state per worker 0\.\.1 "
                                         r"\(num_workers_per_csx=2\), got states for "
                                         r"local_worker_ids \[0\]"):
        from workers.context import DataLoaderCheckpoint
        CsxInputStream(dl, CSConfig(num_workers_per_csx=2), 0, policy=FLOW,
                       resume_states=[DataLoaderCheckpoint(num_workers_per_csx=2)])
    assert live_actors(ray_session, "cstream") == []


def test_the_lean_loader_iterator_yields_what_the_loader_yields_and_keeps_profiler_labels():
    from workers.resume import lean_iter as _lean_iter

    data = torch.utils.data.TensorDataset(torch.arange(40.0)[:, None])

    def batches(make_iter):
        torch.manual_seed(7)  # the shuffle draws from the global generator per epoch
        loader = TorchDataLoader(data, batch_size=4, shuffle=True)
        return [b[0][:, 0].tolist() for epoch in range(2) for b in make_iter(loader)]

    assert batches(_lean_iter) == batches(iter)
    loader = TorchDataLoader(data, batch_size=4)
    it = _lean_iter(loader)
    assert type(it).__name__ == "LeanLoaderIter"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        next(it)
    assert any("DataLoader" in e.name for e in prof.events())
    # loaders with worker processes keep their own iterator
    assert type(_lean_iter(TorchDataLoader(data, num_workers=1))).__name__ != "LeanLoaderIter"


def meta_fn():
    return [torch.empty(2, 3, device="meta")]


def test_a_batch_that_cannot_be_sent_fails_the_stream_naming_the_batch(ray_session):
    with CsxInputStream(DataLoader(meta_fn), CSConfig(), 0, policy=FLOW, name_prefix="meta") as s:
        with pytest.raises(InputWorkerError) as ei:
            s.next()
    assert str(ei.value).startswith("CS-X 0, input worker 0 of 1, global batch 0 (step 1, the "
                                    "worker's batch 0): input_fn failed while sending this batch")
