"""The torch and Ray names the input side uses beyond their documented API
(:mod:`workers.torch_compat`, :mod:`workers.ray_compat`) are there in the installed versions,
and mean what the input side takes them to mean. A version that renames one fails here, with
the name."""

from __future__ import annotations

import importlib
import pathlib
import re

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
