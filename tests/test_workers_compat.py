"""The torch and Ray names the input side uses beyond their documented API
(:mod:`workers.torch_compat`, :mod:`workers.ray_compat`) are there in the installed versions,
and mean what the input side takes them to mean. A version that renames one fails here, with
the name."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from workers import ray_compat, torch_compat

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module,name", [
    ("torch.utils._pytree", "tree_flatten"),
    ("torch.utils._pytree", "tree_unflatten"),
    ("torch.utils._pytree", "tree_map_only"),
    ("torch.utils.data.dataloader", "_SingleProcessDataLoaderIter"),
    ("torch.autograd", "_profiler_enabled"),
    ("torch.utils.data._utils.pin_memory", "pin_memory"),
    ("torch.utils.data._utils.fetch", "_MapDatasetFetcher"),
])
def test_the_torch_names_exist(module, name):
    assert hasattr(importlib.import_module(module), name), \
        f"torch {torch.__version__} has no {module}.{name} (used by workers.torch_compat)"


def test_the_single_process_iterator_has_every_field_the_lean_iterator_reads():
    it = iter(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
    missing = [a for a in torch_compat.SINGLE_PROCESS_ITER_ATTRS if not hasattr(it, a)]
    assert not missing, (f"torch {torch.__version__}: _SingleProcessDataLoaderIter has no "
                         f"{missing} (used by workers.torch_compat.LeanLoaderIter)")
    assert torch_compat.single_process_iter(it)


def test_the_lean_iterator_yields_what_the_loader_yields_and_keeps_the_indices():
    data = [torch.tensor([float(i)]) for i in range(10)]

    def loader():
        return torch.utils.data.DataLoader(data, batch_size=3, shuffle=True,
                                           generator=torch.Generator().manual_seed(1))

    expected = [b.tolist() for b in loader()]
    it = torch_compat.LeanLoaderIter(iter(loader()))
    got, indices = [], []
    for b in it:
        got.append(b.tolist())
        indices.append(list(it.last_index))
    assert got == expected
    assert [[data[i].item() for i in ix] for ix in indices] == [[x[0] for x in b] for b in got]


class _Rows(torch.utils.data.TensorDataset):
    def __getitem__(self, i):
        return tuple(t[i] + 1 for t in self.tensors)


def _tensor_data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 40, generator=g).t()  # not contiguous: each row is a strided view
    tokens = torch.randint(0, 50, (40, 9), generator=g)
    return x, tokens[:, :-1], torch.arange(40) % 7, torch.rand(40, generator=g) > 0.5


@pytest.mark.parametrize("make", [
    lambda: torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_tensor_data()),
                                        batch_size=8, shuffle=True,
                                        generator=torch.Generator().manual_seed(1)),
    lambda: torch.utils.data.DataLoader(torch.utils.data.TensorDataset(_tensor_data()[2]),
                                        batch_size=5, drop_last=False),
    lambda: torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*_tensor_data()),
        batch_sampler=torch.utils.data.BatchSampler(
            torch.utils.data.RandomSampler(range(40), generator=torch.Generator().manual_seed(2)),
            batch_size=7, drop_last=False)),
], ids=["shuffled-4-tensors", "one-tensor-short-last-batch", "batch-sampler"])
def test_a_tensor_datasets_batches_are_gathered_as_torch_collates_them(make, monkeypatch):
    expected = list(make())
    items = []
    item = torch.utils.data.TensorDataset.__getitem__
    monkeypatch.setattr(torch.utils.data.TensorDataset, "__getitem__",
                        lambda self, i: items.append(i) or item(self, i))
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as in an input worker
    try:
        it = torch_compat.LeanLoaderIter(iter(make()))
        assert it.rows_of is not None
        got = list(it)
    finally:
        torch.set_num_threads(before)
    assert items == []  # gathered, not fetched a sample at a time
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is type(e) is list and len(g) == len(e)
        for a, b in zip(g, e):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            assert torch.equal(a, b)


_POOLS = textwrap.dedent("""
    import json, os, threading
    import torch
    from workers.torch_compat import LeanLoaderIter
    torch.set_num_threads(2)
    torch.randn(1 << 20).add_(1)  # the main thread's OpenMP pool, as a wafer's
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(2048, 784)), batch_size=64)
    out = {}
    def run(threads):
        torch.set_num_threads(threads)
        before = len(os.listdir("/proc/self/task"))
        it = LeanLoaderIter(iter(loader))
        for _ in range(4):
            next(it)
        out[threads] = len(os.listdir("/proc/self/task")) - before
    for threads in (2, 1):
        t = threading.Thread(target=run, args=(threads,))
        t.start()
        t.join()
    print(json.dumps(out))
""")


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_the_gather_starts_no_thread_pool_beside_a_wafers():
    done = subprocess.run([sys.executable, "-c", _POOLS], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    # new threads while a loader thread took 4 batches of 64 x 784: a gather there would
    # start an OpenMP pool (one more thread) on a thread running ops on 2 threads
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"2": 0, "1": 0}


def test_other_datasets_and_collates_take_torchs_own_fetch():
    x = _tensor_data()[0]
    custom = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4,
                                         collate_fn=lambda b: torch.stack([r[0] for r in b]))
    subclass = torch.utils.data.DataLoader(_Rows(x), batch_size=4)
    unbatched = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=None)
    grads = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x.clone().requires_grad_()), batch_size=4)
    for loader in (custom, subclass, unbatched, grads):
        it = torch_compat.LeanLoaderIter(iter(loader))
        assert it.rows_of is None
        got, expected = list(it), list(loader)
        assert len(got) == len(expected)
        assert all(torch.equal(torch.as_tensor(g[0] if isinstance(g, list) else g),
                               torch.as_tensor(e[0] if isinstance(e, list) else e))
                   for g, e in zip(got, expected))


def test_the_actor_name_in_use_error_is_recognised(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Named:
        def ping(self):
            return 1

    first = Named.options(name="compat-name-taken").remote()
    try:
        ray.get(first.ping.remote())
        with pytest.raises(ValueError) as raised:
            Named.options(name="compat-name-taken").remote()
        assert ray_compat.name_taken(raised.value), (
            f"ray {ray.__version__}: the error for a named actor whose name is in use no longer "
            f"holds any of {ray_compat.NAME_TAKEN_WORDS}: {raised.value}")
    finally:
        ray.kill(first)


def test_an_actor_whose_constructor_raised_is_told_apart(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Failing:
        def __init__(self):
            raise ValueError("no")

        def ping(self):
            return 1

    actor = Failing.remote()
    with pytest.raises(ray.exceptions.RayActorError) as raised:
        ray.get(actor.ping.remote(), timeout=60)
    assert ray_compat.actor_init_failed(raised.value), (
        f"ray {ray.__version__}: RayActorError.actor_init_failed no longer says that the "
        "actor's constructor raised")
    assert not ray_compat.actor_init_failed(ValueError("x"))


def test_no_private_torch_or_ray_name_is_reached_in_workers_outside_the_compat_modules():
    pattern = re.compile(r"\b(?:torch|ray)[\w.]*\._\w+|\bfrom (?:torch|ray)[\w.]* import _")
    found = []
    for path in sorted((REPO / "workers").glob("*.py")):
        if path.name in ("torch_compat.py", "ray_compat.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#")[0]):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
