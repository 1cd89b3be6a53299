"""The input side keeps its promises on users' data, as users write their input functions:
duplicates are reported where the user sees them, resumes are exact, Parquet files stream the
single-process rows at any worker count, in-flight bytes are bounded, errors read well,
directories are the user's."""

from __future__ import annotations

import ast
import functools
import json
import random
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, TensorDataset

import cstream as cstorch
from workers.context import WorkerInfo, worker_context

from helpers.runs import record_run

REPO = Path(__file__).resolve().parents[1]


# -- input functions ---------------------------------------------------------------------------
def unsharded_input_fn(shuffle=False):
    """What a new user writes first: every worker builds the same DataLoader."""
    data = TensorDataset(torch.arange(32.0)[:, None])
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=shuffle, drop_last=True)


def sharded_input_fn():
    data = TensorDataset(torch.arange(32.0)[:, None])
    batches = BatchSampler(range(32), batch_size=4, drop_last=True)
    return torch.utils.data.DataLoader(data, batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def own_shard_input_fn():
    """Each worker's dataset holds its own samples, numbered 0, 1, ... by its sampler."""
    info = cstorch.distributed.get_worker_info()
    ids = torch.arange(32.0)[info.global_worker_id::info.total_num_workers]
    return torch.utils.data.DataLoader(TensorDataset(ids[:, None]), batch_size=2)


def seeded_shuffle_input_fn(seed=3):
    """examples/data.py's pattern: RandomSampler with a seeded generator, global batches."""
    data = TensorDataset(torch.arange(40)[:, None])
    order = RandomSampler(data, generator=torch.Generator().manual_seed(seed))
    batches = BatchSampler(order, batch_size=4, drop_last=True)  # 10 global batches an epoch
    return torch.utils.data.DataLoader(data, batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def global_rng_shuffle_input_fn():
    """DataLoader(shuffle=True) with no generator: the shuffle draws from torch's global RNG."""
    return torch.utils.data.DataLoader(TensorDataset(torch.arange(12)[:, None]), batch_size=4,
                                       shuffle=True)


class PythonShuffledBatches:
    """Global batches shuffled with Python's own random module: not drawn again on resume."""

    def __iter__(self):
        order = list(range(20))
        random.shuffle(order)
        return iter([order[i:i + 4] for i in range(0, 20, 4)])

    def __len__(self):
        return 5


def python_shuffle_input_fn():
    data = TensorDataset(torch.arange(20)[:, None])
    return torch.utils.data.DataLoader(
        data, batch_sampler=cstorch.utils.data.ShardedSampler(PythonShuffledBatches()))


def generator_input_fn():
    """A one-shot generator of 3 batches."""
    return ((torch.full((2, 1), float(i)),) for i in range(3))


def failing_input_fn():
    """Worker 1 of 2 fails at its 10th batch (CS-X step 20)."""
    info = cstorch.distributed.get_worker_info()

    def batches():
        for i in range(100):
            if info.local_worker_id == 1 and i == 9:
                raise ValueError(f"row {i} of shard {info.local_worker_id} is corrupt")
            yield torch.full((2, 1), float(10 * i + info.local_worker_id))

    class Loader:
        def __iter__(self):
            return batches()

    return Loader()


# -- running -----------------------------------------------------------------------------------
def stream_only(input_fn, cs_config, steps=4, **options):
    """A run with no model: what the input side reports."""
    backend = cstorch.backend("CSX", **options)
    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn),
                                               num_steps=steps, cs_config=cs_config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in executor:
                pass
        finally:
            backend.shutdown()
    ours = [w for w in caught if issubclass(w.category, cstorch.UnshardedInputWarning)]
    profile = json.loads((executor.run_dir / "profile.json").read_text())
    return ours, profile["summary"]["input_checks"]["duplicates"]


# -- 1. duplicates -----------------------------------------------------------------------------
def test_an_unsharded_input_fn_on_ray_warns_in_the_users_process_with_the_right_count(
        ray_session):
    ours, recorded = stream_only(unsharded_input_fn, cstorch.utils.CSConfig(
        num_csx=2, num_workers_per_csx=2))
    assert len(ours) == 1  # a Python warning here, not a forwarded log line of the driver
    msg = str(ours[0].message)
    assert msg.startswith("input_fn unsharded_input_fn streams the same samples on 4 input "
                          "workers (CS-X 0 worker 0, CS-X 0 worker 1, CS-X 1 worker 0, CS-X 1 "
                          "worker 1)")
    assert "streamed 4 times as often as intended" in msg
    assert ours[0].filename == __file__  # points at the user's loop
    assert recorded["times"] == 4 and recorded["by"] == "sample ids"
    assert recorded["message"] == msg


@pytest.mark.parametrize("layout,shuffle", [((1, 4), True), ((2, 1), False), ((2, 1), True)])
def test_unsharded_input_is_found_when_shuffled_and_across_csxs(layout, shuffle):
    torch.manual_seed(0)  # in-process workers shuffle with this process's global generator
    ours, recorded = stream_only(lambda: unsharded_input_fn(shuffle), cstorch.utils.CSConfig(
        num_csx=layout[0], num_workers_per_csx=layout[1]), in_process=True)
    times = layout[0] * layout[1]
    assert len(ours) == 1 and recorded["times"] == times
    assert f"streamed {times} times as often as intended" in str(ours[0].message)


@pytest.mark.parametrize("input_fn", [sharded_input_fn, own_shard_input_fn])
def test_sharded_input_fns_are_not_reported(input_fn):
    ours, recorded = stream_only(input_fn, cstorch.utils.CSConfig(num_csx=2, num_workers_per_csx=2),
                                 in_process=True)
    assert ours == [] and recorded is None


def test_duplicate_samples_error_stops_the_run_before_its_first_step():
    backend = cstorch.backend("CSX", in_process=True)
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(unsharded_input_fn), num_steps=4,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=3, duplicate_samples="error"))
    with pytest.raises(cstorch.UnshardedInputError, match="on 3 input workers") as e:
        for _ in executor:
            pass
    backend.shutdown()
    assert e.value.times == 3 and executor.step_records == []


# -- 2. exact resume ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind,options,cfg", [
    ("CPU", {}, None),
    ("CSX", {"in_process": True}, cstorch.utils.CSConfig(num_workers_per_csx=2)),
])
def test_a_resume_with_a_seeded_random_sampler_equals_the_uninterrupted_run(kind, options, cfg):
    full = record_run(kind, seeded_shuffle_input_fn, 30, cfg, **options).seen
    epochs = [full[i:i + 40] for i in range(0, 120, 40)]
    assert all(sorted(e) == list(range(40)) for e in epochs) and epochs[0] != epochs[1]
    run = record_run(kind, seeded_shuffle_input_fn, 15, cfg, checkpoint_steps=15, **options)
    head, states = run.seen, run.states
    tail = record_run(kind, seeded_shuffle_input_fn, 15, cfg, resume=states[14], **options).seen
    assert head + tail == full  # epoch 1 from its 6th batch, then epoch 2: no sample twice


def test_on_ray_a_global_rng_shuffle_resumes_exactly_in_a_fresh_worker(ray_session):
    # each worker process seeds torch at random: the run that saved the state is the reference
    run = record_run("CSX", global_rng_shuffle_input_fn, 8, checkpoint_steps=5)
    full, states = run.seen, run.states
    tail = record_run("CSX", global_rng_shuffle_input_fn, 3, resume=states[4]).seen
    assert [sorted(full[i:i + 12]) for i in (0, 12)] == [list(range(12))] * 2
    # the resumed worker draws epoch 1 from the state its epoch started with, then epoch 2 on
    assert full[:20] + tail == full


def test_a_shuffle_that_cannot_be_drawn_again_refuses_to_resume():
    states = record_run("CPU", python_shuffle_input_fn, 7, checkpoint_steps=7).states
    with pytest.raises(ValueError) as e:
        record_run("CPU", python_shuffle_input_fn, 3, resume=states[6])
    assert str(e.value).startswith(
        "ShardedSampler: the resumed position is global batch 2 of epoch 1, but the global "
        "batches before it are not the ones the saved run streamed")
    assert "its own seeded generator" in str(e.value)


# -- 3. Parquet: the single-process rows at any worker count ------------------------------------
def twelve_row_groups(tmp_path):
    """3 files x 4 row groups x 40 rows: rows 0..479 in (file, row group, row) order."""
    paths = []
    for f in range(3):
        path = tmp_path / f"part{f}.parquet"
        pq.write_table(pa.table({"x": pa.array(range(160 * f, 160 * (f + 1)), pa.int64())}),
                       path, row_group_size=40)
        paths.append(str(path))
    return paths


def parquet_fn(paths, drop_last=True):
    return cstorch.utils.data.ParquetDataset(paths, batch_size=8, drop_last=drop_last)


@pytest.mark.parametrize("in_process, drop_last, mode", [
    (False, True, "dynamic"), (True, True, "static"), (True, False, "static")])
def test_parquet_with_12_row_groups_over_1x8_workers_streams_the_single_process_rows(
        request, tmp_path, in_process, drop_last, mode):
    # 60 global batches of 8 rows an epoch; each worker's share, 60 rows, is not a multiple of
    # 8, and no worker drops (or shortens) a batch of its own: two epochs, each row once in
    # each, in the order one process reads them; Ray's input workers take their numbers
    # dynamically, the in-process ones round-robin
    if not in_process:
        request.getfixturevalue("ray_session")
    fn = functools.partial(parquet_fn, twelve_row_groups(tmp_path), drop_last)
    run = record_run("CSX", fn, 120, cstorch.utils.CSConfig(num_workers_per_csx=8),
                     in_process=in_process)
    seen, executor = run.seen, run.executor
    assert seen == list(range(480)) * 2
    assert executor.report["input_assignment"]["mode"] == mode


@pytest.mark.parametrize("drop_last", [True, False])
def test_parquet_1x8_any_assignment_of_numbers_gives_the_single_process_rows(tmp_path,
                                                                             drop_last):
    # what each Ray input worker runs under dynamic assignment (the default), in-process:
    # numbers 0..119 (two epochs) dealt to the 8 workers in a seeded random pattern
    from workers.context import BatchAssignment, batch_assignment
    from workers.dataloader import DataLoader
    from workers.resume import Source

    loader = DataLoader(parquet_fn, twelve_row_groups(tmp_path), drop_last)
    rng = random.Random(7)
    owner = [rng.randrange(8) for _ in range(120)]
    rows = {}
    for w in range(8):
        info = WorkerInfo(local_worker_id=w, num_workers_per_csx=8)
        assignment = BatchAssignment()
        assignment.extend(0, [s for s in range(120) if owner[s] == w])
        with worker_context(info), batch_assignment(assignment):
            source = Source(loader, loader.build(info))
            for s in range(120):
                if owner[s] == w:
                    rows[s] = next(source)["x"].tolist()
    assert [i for s in range(120) for i in rows[s]] == list(range(480)) * 2


def test_parquet_on_2x2_resumes_with_another_worker_count_exactly(ray_session, tmp_path):
    fn = functools.partial(parquet_fn, twelve_row_groups(tmp_path))
    cfg = cstorch.utils.CSConfig(num_csx=2, num_workers_per_csx=2)
    # 27 steps: the saved position is row 216, inside the 2nd row group of the 2nd file
    run = record_run("CSX", fn, 27, cfg, checkpoint_steps=27)
    head, states, executor = run.seen, run.states, run.executor
    assert head == list(range(216))
    assert executor.report["input_assignment"]["mode"] == "dynamic"
    tail = record_run("CSX", fn, 40, cstorch.utils.CSConfig(num_workers_per_csx=2),
                      resume=states[26]).seen
    assert tail == list(range(216, 480)) + list(range(56))  # into the next epoch


def test_parquet_in_process_resumes_with_another_worker_count_exactly(tmp_path):
    # the in-process input side deals round-robin (static): saved at 1x8, resumed at 2x3
    fn = functools.partial(parquet_fn, twelve_row_groups(tmp_path), False)
    run = record_run("CSX", fn, 13, cstorch.utils.CSConfig(num_workers_per_csx=8),
                     checkpoint_steps=13, in_process=True)
    head, states = run.seen, run.states
    assert head == list(range(104))
    tail = record_run("CSX", fn, 50, cstorch.utils.CSConfig(num_csx=2, num_workers_per_csx=3),
                      resume=states[12], in_process=True).seen
    assert tail == list(range(104, 480)) + list(range(24))


# -- 5. errors ---------------------------------------------------------------------------------
def test_an_input_fn_error_on_ray_reads_well_and_every_finished_step_keeps_its_closures(
        ray_session):
    import ray

    backend = cstorch.backend("CSX")
    compiled = cstorch.compile(torch.nn.Linear(1, 1), backend)
    closed = []

    @cstorch.trace
    def step(x):
        return x + compiled.weight.sum() * 0

    @cstorch.step_closure
    def record(x):
        closed.append(x[0, 0].item())

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(failing_input_fn), num_steps=40,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=2))
    with pytest.raises(cstorch.InputWorkerError) as e:
        for batch in executor:
            record(step(batch))
    backend.shutdown()
    lines = str(e.value).splitlines()
    assert lines[0] == ("CS-X 0, input worker 1 of 2, global batch 19 (step 20, the worker's "
                        "batch 9): input_fn failed while producing this batch: ValueError: "
                        "row 9 of shard 1 is corrupt")
    assert lines[2:4] == ["input_fn's traceback, in the input worker:",
                         "Traceback (most recent call last):"]
    assert lines[4].endswith(", in batches")
    assert 'raise ValueError(f"row {i} of shard {info.local_worker_id} is corrupt")' in str(e.value)
    assert lines[-1] == "ValueError: row 9 of shard 1 is corrupt"
    assert "ray::" not in str(e.value) and "/workers/" not in str(e.value)
    assert isinstance(e.value.__cause__, ray.exceptions.RayTaskError)  # the raw chain
    # the traceback starts in the user's loop: no Ray or run-machinery frames above it
    frames = [f.filename for f in __import__("traceback").extract_tb(e.value.__traceback__)]
    assert frames[0] == __file__ and all("ray" not in f for f in frames)
    # the wafer finished 19 steps: all 19 had their closures run
    assert closed == [10 * (s // 2) + s % 2 for s in range(19)]


# -- 6. a generator past its end ---------------------------------------------------------------
@pytest.mark.parametrize("kind,options", [("CPU", {}), ("CSX", {"in_process": True})])
def test_a_generator_input_fn_used_past_its_end_says_so(kind, options):
    with pytest.raises(cstorch.utils.data.EmptyDataLoaderError) as e:
        record_run(kind, generator_input_fn, 5, **options)
    msg = str(e.value)
    assert "input_fn generator_input_fn returned a one-shot iterator (generator), which was " \
           "used up after 3 batches, and the run needs more" in msg
    assert "batch_size" not in msg
    assert type(e.value).__name__ == "ExhaustedIteratorError"


# -- 7. directories ----------------------------------------------------------------------------
def test_relative_directories_are_the_users_not_the_ray_workers(ray_session, tmp_path):
    user_dir = tmp_path / "project"
    user_dir.mkdir()
    import os

    os.chdir(user_dir)  # the fixture restores the working directory
    run = record_run("CSX", sharded_input_fn, 2, artifact_dir="art", compile_dir="cc")
    seen, executor = run.seen, run.executor
    assert len(seen) == 8
    assert executor.run_dir.parent.parent == user_dir / "art"
    assert any((user_dir / "cc").iterdir())  # the wafer driver's compile cache


# -- 8. layering -------------------------------------------------------------------------------
def test_workers_import_nothing_from_executor_or_cstream():
    for path in sorted((REPO / "workers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in ("executor", "cstream"), (path.name, name)


def _workers_imports() -> dict[str, set[str]]:
    """Each module of ``workers/`` and the modules of ``workers/`` it imports, at its top or
    inside a function (``from workers import x`` counts as importing ``workers.x`` where that
    is a module)."""
    modules = {p.stem for p in (REPO / "workers").glob("*.py") if p.stem != "__init__"}
    graph = {}
    for m in modules:
        deps = set()
        for node in ast.walk(ast.parse((REPO / "workers" / f"{m}.py").read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "workers":
                names = [f"workers.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            deps |= {n.split(".")[1] for n in names
                     if n.startswith("workers.") and n.split(".")[1] in modules}
        graph[m] = deps - {m}
    return graph


def test_the_modules_of_workers_import_each_other_without_a_circle():
    graph = _workers_imports()
    assert graph["input_worker"] >= {"wire", "resume"}  # the walk sees imports at all
    circles = []

    def visit(m, path):
        for d in sorted(graph[m]):
            if d in path:
                circles.append(path[path.index(d):] + [d])
            elif d not in done:
                visit(d, path + [d])
        done.add(m)

    done: set[str] = set()
    for m in sorted(graph):
        if m not in done:
            visit(m, [m])
    assert circles == []


def test_the_ray_address_is_read_once_in_cstream_backend(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    backend = cstorch.backend("CSX", in_process=True)
    assert backend.options.address == "127.0.0.1:6390"
    backend.shutdown()
    for folder in ("executor", "workers"):
        for path in (REPO / folder).rglob("*.py"):
            assert 'environ.get("RAY_ADDRESS")' not in path.read_text(), path


def test_cpu_and_in_process_runs_save_one_position_format():
    cpu = record_run("CPU", seeded_shuffle_input_fn, 13, checkpoint_steps=13).states
    csx = record_run("CSX", seeded_shuffle_input_fn, 13, checkpoint_steps=13, in_process=True).states
    a, b = cpu[12]["workers"][0], csx[12]["workers"][0]
    # the same keys, the same values; only torch's global RNG differs between the two processes
    for state in (a, b):
        state["user_state_dict"]["rng"].pop("global")
    assert a["user_state_dict"] == b["user_state_dict"]
    assert (a["worker_step"], a["user_state_dict"]["epoch"],
            a["user_state_dict"]["batch_in_epoch"]) == (13, 1, 3)


# -- 4. bytes in flight ------------------------------------------------------------------------
def counted_megabyte_fn(path):
    """1 MiB batches forever; the count produced so far is written to ``path``."""
    def gen():
        produced = 0
        while True:
            produced += 1
            with open(path, "w") as f:
                f.write(str(produced))
            yield torch.full((256, 1024), float(produced))

    class Forever:
        def __iter__(self):
            return gen()

    return Forever()


def _settled(path, at_least=0, timeout_s=60.0):
    """The count in ``path`` once it reached ``at_least`` (however long a loaded machine takes)
    and then stayed put for 0.8 s. A busy machine can only end the wait early, which reads a
    count too low to break an upper bound, never one too high."""
    import time

    last, since, deadline = None, time.time(), time.time() + timeout_s
    while time.time() < deadline:
        try:
            now = int(Path(path).read_text() or 0)
        except (FileNotFoundError, ValueError):
            now = None
        if now != last:
            last, since = now, time.time()
        elif now is not None and now >= at_least and time.time() - since > 0.8:
            break
        time.sleep(0.05)
    return last


def test_the_object_store_is_sized_from_memory_and_bounds_the_input_bytes(ray_session):
    from executor.ray_session import machine_memory_bytes
    from workers.flow import FlowPolicy, object_store_bytes_for
    from workers.stream import CsxInputStream

    store = ray_session.cluster_resources()["object_store_memory"]
    assert store == pytest.approx(object_store_bytes_for(machine_memory_bytes()), rel=0.01)
    assert store > 512 * 2**20  # no longer a fixed 512 MiB on this machine
    cfg = cstorch.utils.CSConfig(num_workers_per_csx=4)
    with CsxInputStream(cstorch.utils.data.DataLoader(counted_megabyte_fn, "/dev/null"), cfg, 0,
                        policy=FlowPolicy.from_config(cfg), name_prefix="bytesdefault") as s:
        assert s.in_flight_bytes_per_worker == int(store * 0.25) // 4


@pytest.mark.parametrize("budget_mib,most_ahead", [(None, 12), (2, 5)])
def test_a_workers_bytes_in_flight_stay_within_the_configured_bound(
        ray_session, tmp_path, budget_mib, most_ahead):
    from workers.flow import FlowPolicy
    from workers.stream import CsxInputStream

    path = str(tmp_path / "produced")
    cfg = cstorch.utils.CSConfig(input_bytes_in_flight_per_csx=budget_mib and budget_mib << 20)
    # replies of at most batches_per_fetch batches: the bound below counts in batches
    policy = FlowPolicy.from_config(cfg, small_reply_batches=1)
    with CsxInputStream(cstorch.utils.data.DataLoader(counted_megabyte_fn, path), cfg, 0,
                        policy=policy, name_prefix=f"bytes{budget_mib}") as s:
        got = [s.next()[0][0, 0].item() for _ in range(5)]
        assert got == [1.0, 2.0, 3.0, 4.0, 5.0]
        # with the default budget the producer runs more than 5 batches ahead: wait for that
        ahead = _settled(path, at_least=5 + 6 if budget_mib is None else 0) - 5
        stats = ray_session.get(s.workers[0].actor.stats.remote())
    if budget_mib is None:  # a quarter of the object store: the batch counts bind first
        assert 5 < ahead <= most_ahead == s.max_batches_ahead
    else:
        # received or requested here (2 MiB), buffered in the worker (2 MiB), one being made
        assert ahead <= most_ahead
        assert stats["buffered_bytes"] <= 2 << 20
