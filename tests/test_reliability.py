"""Failures end runs clearly: bad batches, a dead driver, and Ray's security defaults."""

from __future__ import annotations

import ipaddress
import os

import pytest
import torch

import cstream as cstorch
from executor.driver import BatchSpecError, DriverError


def _linear_step(backend):
    compiled = cstorch.compile(torch.nn.Linear(4, 2), backend)

    @cstorch.trace
    def step(batch):
        return compiled(batch[0]).sum()

    return step


def _run(input_fn, steps=5, workers=1, **options):
    backend = cstorch.backend("CSX", **options)
    step = _linear_step(backend)
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(input_fn), num_steps=steps,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
    try:
        for batch in executor:
            step(batch)
    finally:
        backend.shutdown()


def short_last_batch():
    return [(torch.ones(3, 4),)] * 3 + [(torch.ones(2, 4),)]


def changing_dtype():
    return [(torch.ones(3, 4),)] * 2 + [(torch.ones(3, 4, dtype=torch.float64),)]


def non_tensor_leaf():
    return [(torch.ones(3, 4), "label")] * 3


def empty_batch():
    return [(torch.ones(0, 4),)] * 3


@pytest.mark.parametrize("in_process", [True, False])
def test_a_batch_whose_shape_differs_from_the_traced_spec_names_step_worker_and_shapes(
        in_process, request):
    if not in_process:
        request.getfixturevalue("ray_session")
    with pytest.raises(BatchSpecError) as info:
        _run(short_last_batch, in_process=in_process)
    msg = str(info.value)
    assert "step 4, CS-X 0, worker 0" in msg
    assert "(2, 4) torch.float32" in msg and "expects (3, 4) torch.float32" in msg
    assert "drop_last=True" in msg


def test_a_batch_whose_dtype_changes_is_refused():
    with pytest.raises(BatchSpecError, match=r"step 3, .*torch.float64.*expects \(3, 4\) torch.float32"):
        _run(changing_dtype, in_process=True)


def test_a_non_tensor_leaf_is_refused_before_anything_is_traced():
    with pytest.raises(BatchSpecError, match=r"leaf 1 of the batch is a str \('label'\), not a tensor"):
        _run(non_tensor_leaf, in_process=True)


def test_an_empty_batch_is_refused():
    with pytest.raises(BatchSpecError, match=r"leaf 0 of the batch is empty \(shape \(0, 4\)\)"):
        _run(empty_batch, in_process=True)


def test_an_input_fn_that_yields_nothing_says_so_and_suggests_batch_size():
    with pytest.raises(cstorch.utils.data.EmptyDataLoaderError, match="yields no batch.*batch_size"):
        _run(lambda: [], in_process=True)


@pytest.mark.timeout(600)  # a run that hangs on its dead driver fails here, a slow one does not
def test_the_driver_actor_dying_mid_run_ends_the_run_with_a_clear_error(ray_session):
    ray = ray_session
    backend = cstorch.backend("CSX")
    step = _linear_step(backend)

    def endless():
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                while True:
                    yield (torch.ones(3, 4),)
        return torch.utils.data.DataLoader(Stream(), batch_size=None)

    seen = []

    @cstorch.step_closure
    def record(out):
        seen.append(out.item())

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(endless), num_steps=10_000)
    with pytest.raises(DriverError, match="wafer driver actor died"):
        for i, batch in enumerate(executor):
            record(step(batch))
            if i == 20:
                ray.kill(backend.driver().actor)
    assert len(seen) >= 20
    backend.shutdown()


def _descendants(root):
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _listening_tcp():
    """(address, port) of every listening TCP socket, keyed by inode, from /proc/net."""
    listening = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A":                      # TCP_LISTEN
                continue
            addr, port = cols[1].split(":")
            raw = bytes.fromhex(addr)
            # the kernel prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            listening[cols[9]] = (ipaddress.ip_address(words), int(port, 16))
    return listening


def test_ray_listens_on_loopback_only_with_the_dashboard_off(ray_session):
    ray = ray_session
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs Linux /proc/net")
    listening = _listening_tcp()
    ours = {}
    processes = _descendants(os.getpid())
    for pid in processes:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "dashboard/dashboard.py" in cmdline:  # Ray's minimal head process: no web UI
            assert "--minimal" in cmdline and "--disable-frontend" in cmdline, cmdline
    for pid in processes:
        for inode in _socket_inodes(pid):
            if inode in listening:
                ours[inode] = (pid, *listening[inode])
    assert ours, "found no listening socket of this session's Ray"
    for pid, address, port in ours.values():
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        assert address.is_loopback, f"pid {pid} listens on {address}:{port}"
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"


def _sharded_ids_input_fn(n=16, batch=2):
    from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

    x = torch.arange(n * batch, dtype=torch.float32)[:, None]
    batches = BatchSampler(SequentialSampler(range(n * batch)), batch_size=batch, drop_last=True)
    return torch.utils.data.DataLoader(
        TensorDataset(x), batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def _training_run(steps, ckpt_dir, resume=None, kill_at=None, workers=2):
    ckpt_dir.mkdir(exist_ok=True)
    torch.manual_seed(0)
    backend = cstorch.backend("CSX")
    model = torch.nn.Linear(1, 1)
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = cstorch.utils.data.DataLoader(_sharded_ids_input_fn)
    if resume is not None:
        state = cstorch.load(resume)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["dataloader"])
    seen = []

    @cstorch.trace
    def step(batch):
        (x,) = batch
        loss = (compiled(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss, x

    @cstorch.step_closure
    def record(loss, x):
        seen.append((loss.item(), x.flatten().tolist()))

    @cstorch.checkpoint_closure
    def save(i):
        cstorch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "dataloader": loader.state_dict()}, ckpt_dir / f"ckpt_{i + 1}.h5")

    executor = cstorch.utils.data.DataExecutor(
        loader, num_steps=steps, checkpoint_steps=4,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
    try:
        for i, batch in enumerate(executor):
            record(*step(batch))
            save(i)
            if kill_at is not None and i == kill_at:
                import ray

                ray.kill(backend.driver().actor)
    finally:
        backend.shutdown()
    return seen


def test_after_the_driver_dies_a_new_run_resumes_from_the_last_checkpoint_exactly(
        ray_session, tmp_path):
    reference = _training_run(12, tmp_path / "ref")
    (tmp_path / "run").mkdir()
    with pytest.raises(DriverError, match="resume from the newest one"):
        _training_run(12, tmp_path / "run", kill_at=9)
    newest = tmp_path / "run" / "ckpt_8.h5"
    assert newest.exists() and not (tmp_path / "run" / "ckpt_12.h5").exists()
    assert not list((tmp_path / "run").glob(".*.tmp"))  # nothing partial left
    resumed = _training_run(4, tmp_path / "run", resume=newest)
    assert resumed == reference[8:]


def test_a_resume_that_cannot_honour_the_saved_topology_names_both(tmp_path):
    def per_worker_ids():
        info = cstorch.distributed.get_worker_info()
        return [torch.full((2,), float(i)) for i in range(info.local_worker_id, 12,
                                                             info.num_workers_per_csx)]

    states = {}
    backend = cstorch.backend("CSX", in_process=True)
    loader = cstorch.utils.data.DataLoader(per_worker_ids)

    @cstorch.checkpoint_closure
    def save():
        states["dl"] = loader.state_dict()

    for _ in cstorch.utils.data.DataExecutor(
            loader, num_steps=4, checkpoint_steps=4,
            cs_config=cstorch.utils.CSConfig(num_workers_per_csx=2)):
        save()
    backend.shutdown()
    backend = cstorch.backend("CSX", in_process=True)
    loader = cstorch.utils.data.DataLoader(per_worker_ids)
    loader.load_state_dict(states["dl"])
    with pytest.raises(ValueError, match=r"saved with num_csx=1, num_workers_per_csx=2, and this "
                                         r"run has num_csx=1, num_workers_per_csx=3"):
        for _ in cstorch.utils.data.DataExecutor(
                loader, num_steps=2, cs_config=cstorch.utils.CSConfig(num_workers_per_csx=3)):
            pass
    backend.shutdown()


PRODUCED = {0: 0, 1: 0}


def _one_slow_csx_input_fn():
    """CS-X 1's worker takes 30 ms a batch; CS-X 0's is instant and counts what it produced."""
    import time as _time

    info = cstorch.distributed.get_worker_info()

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                if info.wse_id == 1:
                    _time.sleep(0.03)
                PRODUCED[info.wse_id] += 1
                yield torch.ones(2, 3)

    return torch.utils.data.DataLoader(Stream(), batch_size=None)


def test_a_slow_csx_never_lets_the_other_csx_run_ahead_beyond_its_bounded_buffer():
    backend = cstorch.backend("CSX", in_process=True)
    ahead = []

    @cstorch.step_closure
    def probe(step):
        ahead.append(PRODUCED[0] - step)

    cfg = cstorch.utils.CSConfig(num_csx=2, input_buffer_batches=3)
    for i, _ in enumerate(cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(_one_slow_csx_input_fn), num_steps=25, cs_config=cfg)):
        probe(i + 1)
    backend.shutdown()
    # CS-X 0 produced at most its buffer (3), the batch its feeder holds (1) and the look-ahead
    # of the client over the wafer (8) beyond the step: bounded, never the whole run
    assert max(ahead) <= 3 + 1 + 8 + 1
    assert PRODUCED[1] >= 25
