"""Checkpoint files move both ways between cstream and the real ``cerebras.pytorch`` 2.10.0.

The files and records come from ``tests/reference/gen_ckpt.py``, run under the real package (see
``tests/reference/cstream_written/README.md``): files it saved load in cstream with the same keys,
dtypes and values; the file cstream saved (``tests/reference/cstream_written/``) is what the real
package read back; and a run the real package checkpointed resumes in cstream to the same losses
and weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
from pathlib import Path

import h5py
import pytest
import torch

import cstream as cstorch
from cstream.checkpoint import guard
from cstream.checkpoint.h5 import H5Checkpoint
from cstream.checkpoint.h5_legacy import LegacyH5Checkpoint
from cstream.checkpoint.opener import open_checkpoint
from cstream.checkpoint.saving import CheckpointError, describe
from cstream.checkpoint.v2 import V2Checkpoint
from reference.records import record
from reference.tolerance import assert_number_close, assert_tensor_close

# compares with numbers another program made on another CPU (make test reruns these under
# other float kernels: ATEN_CPU_CAPABILITY / MKL_CBWR)
pytestmark = pytest.mark.cross_cpu

REFERENCE = Path(__file__).resolve().parent / "reference"
FIXTURES = REFERENCE / "fixtures"


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _filters(ds: h5py.Dataset) -> list[tuple]:
    """The dataset's HDF5 filters: (id, flags, parameters) of each."""
    plist = ds.id.get_create_plist()
    return [plist.get_filter(i)[:3] for i in range(plist.get_nfilters())]


def _first_difference(got: list, want: list) -> str:
    for a, b in zip(got, want):
        if a != b:
            return f"cstream read {a}, the real package saved {b}"
    return f"cstream read {len(got)} entries, the real package saved {len(want)}"


@pytest.mark.parametrize("name", ["ckpt_real_state", "ckpt_real_train", "ckpt_real_adam_sched",
                                  "ckpt_legacy_0_4"])
def test_files_the_real_package_wrote_load_with_the_same_keys_dtypes_and_values(name):
    got = record(cstorch.load(FIXTURES / f"{name}.h5"))
    want = _fixture(f"{name}.json")["record"]
    assert got == want, _first_difference(got, want)


@pytest.mark.parametrize("path, reader, opens, layout", [
    (FIXTURES / "ckpt_real_state.h5", H5Checkpoint, 1,
     "cerebras.pytorch layout 0.5, written by cerebras.pytorch 2.10.0"),
    (FIXTURES / "ckpt_legacy_0_4.h5", LegacyH5Checkpoint, 1,
     "cerebras.pytorch layout 0.4, written by cerebras.pytorch 2.0.3"),
    (Path(__file__).resolve().parent / "data" / "cstream_v2_layout.h5", V2Checkpoint, 0,
     "cstream's earlier layout (version 2), written by cstream 0.1"),
])
def test_the_opener_reads_the_layout_version_once_and_gives_that_layouts_reader(
        monkeypatch, path, reader, opens, layout):
    opened = []
    h5_file = h5py.File

    def counted(name, *args, **kwargs):
        opened.append(os.fspath(name))
        return h5_file(name, *args, **kwargs)

    monkeypatch.setattr(h5py, "File", counted)
    checkpoint = open_checkpoint(path, "test")
    assert type(checkpoint) is reader and checkpoint.layout == layout
    assert opened == [os.fspath(path)] * opens  # HDF5 opens the file once, the v2 reader never
    assert record(checkpoint.load(None)) == record(cstorch.load(path))


def test_the_real_files_hold_compressed_tied_and_pickled_entries_cstream_decodes():
    path = FIXTURES / "ckpt_real_state.h5"
    with h5py.File(path, "r") as f:  # what makes the file the real package's own
        assert f.attrs["__cstorch_version__"] == "2.10.0"
        for name, chunks in (("tensors.big", 1), ("tensors.chunks", 2)):
            assert f[name].id.get_create_plist().get_filter(0)[0] == 32004  # LZ4
            assert f[name].id.get_num_chunks() == chunks
        assert json.loads(f.attrs["model.decoder.weight.__metadata__"])[
            "model.decoder.weight.__metadata__"]["__TYPE__"] == "LinkedObject"
        assert "__BYTES__" in f["pickled.complex"].attrs
    state = cstorch.load(path)
    assert state["model"]["decoder.weight"] is state["model"]["fc.weight"]  # tied again
    assert state["pickled"] == {"bytes": b"\x00\xff", "dtype": torch.float16, "complex": 1 - 2j}
    assert state["plain"][7] == "int key" and state["tensors"]["bf16"].dtype == torch.bfloat16
    entries = {e["key"]: e for e in describe(path)}
    assert entries["tensors/big"] == {"key": "tensors/big", "type": "tensor", "dtype": "float32",
                                      "shape": (30, 100), "nbytes": 12000}
    assert entries["model/decoder.weight"]["shape"] == (2, 3)


@pytest.mark.parametrize("layout", ["compressed", "uncompressed"])
def test_a_file_cstream_wrote_loads_in_the_real_package_with_the_same_keys_dtypes_and_values(layout):
    make = _module(REFERENCE / "cstream_written" / "make.py")
    path = make.FILE if layout == "compressed" else make.UNCOMPRESSED
    read_by_real = _fixture("ckpt_cstream_read_by_real.json")[layout]
    assert read_by_real["file"] == f"cstream_written/{path.name}"
    # the real package read this very file, sealed as cstream.save seals every file (a user block
    # with its length and checksum before the HDF5 data)
    assert read_by_real["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert guard.is_sealed(path.read_bytes()[:512])
    with h5py.File(path, "r") as f:  # every tensor but the 0-d ones through the LZ4 filter, or none
        tensors = [f[k] for k in f if f[k].attrs.get("__NUMPY__")]
        lz4 = [ds.name for ds in tensors if [f[0] for f in _filters(ds)] == [32004]]
        assert lz4 == ([ds.name for ds in tensors if ds.ndim] if layout == "compressed" else [])
        assert len(lz4) >= (12 if layout == "compressed" else 0)
    want = record(make.state())
    assert read_by_real["record"] == want, _first_difference(read_by_real["record"], want)
    assert read_by_real["types"] == {"model": "OrderedDict", "optimizer": "dict"}
    assert record(cstorch.load(path)) == want  # and cstream reads its own file the same way


@pytest.mark.parametrize("layout", ["compressed", "uncompressed"])
def test_the_committed_cstream_files_are_what_cstream_writes_today(tmp_path, layout):
    make = _module(REFERENCE / "cstream_written" / "make.py")
    cstorch.save(make.state(), tmp_path / "now.h5", compress=layout == "compressed")

    def layout_of(path):
        with h5py.File(path, "r") as f:
            attrs = {k: v for k, v in f.attrs.items() if k != "__cstorch_version__"}
            datasets = {k: (dict(f[k].attrs), f[k].chunks, _filters(f[k])) for k in f}
        return repr(attrs), repr(datasets)

    committed = make.FILE if layout == "compressed" else make.UNCOMPRESSED
    assert layout_of(tmp_path / "now.h5") == layout_of(committed), (
        f"cstream.save writes another layout than tests/reference/cstream_written/{committed.name}: "
        "rerun tests/reference/cstream_written/make.py, then gen_ckpt under the real package")


def test_a_run_the_real_package_checkpointed_resumes_in_cstream_to_the_same_losses_and_weights():
    """Plain SGD: 3 steps on the real CPU backend, saved; 3 more in cstream."""
    gen = _fixture("ckpt_real_train.json")
    backend = cstorch.backend("CPU")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    state = cstorch.load(FIXTURES / "ckpt_real_train.h5")
    assert state["step"] == 3
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.step_closure
    def keep(loss):
        losses.append(loss.item())

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: _batches(6)[3:]), num_steps=3)
    for x, y in executor:
        keep(step(x, y))
    # the real package's run was on another CPU and torch version: float32's bound, 6 steps
    for step, (ours, theirs) in enumerate(zip(losses, gen["losses"][3:]), 4):
        assert_number_close(ours, theirs, step, f"loss of step {step}")
    assert len(losses) == len(gen["losses"][3:])
    got = {e["key"]: e for e in record(model.state_dict())}
    for want in gen["final_model"]:
        have = got[want["key"]]
        assert (have["dtype"], have["shape"]) == (want["dtype"], want["shape"])
        a = torch.frombuffer(bytearray.fromhex(have["bits"]), dtype=torch.float32)
        b = torch.frombuffer(bytearray.fromhex(want["bits"]), dtype=torch.float32)
        assert_tensor_close(a, b, 6, want["key"])


def _batches(n: int) -> list:
    """gen_ckpt.batches: the run's data (torch's CPU generator gives the same numbers)."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
            for _ in range(n)]


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_legacy_file_whose_pickled_spec_would_run_code_is_refused_and_nothing_runs(tmp_path):
    """Layout 0.4 (cerebras.pytorch 2.0) pickles the tree spec; unpickling it is where a file could
    run code. The spec here is what dill writes for a TreeSpec, with a payload in its context."""
    path, marker = tmp_path / "evil.h5", tmp_path / "marker"
    shutil.copy(FIXTURES / "ckpt_legacy_0_4.h5", path)
    assert cstorch.load(path)["step"] == 2  # the untouched copy loads
    with h5py.File(path, "r") as f:
        spec = bytes.fromhex(f.attrs["__spec__"])
    assert b"torch.utils._pytree" in spec and b"TreeSpec" in spec and b"_load_type" in spec
    evil = pickle.dumps(_RunsCode(marker), protocol=4)
    with h5py.File(path, "r+") as f:
        f.attrs["__spec__"] = evil.hex()
    with pytest.raises(CheckpointError) as info:
        cstorch.load(path)
    assert str(info.value) == (
        f"{path}: its tree spec (__spec__) is a pickle that names posix.system, which cstream "
        "refuses to load: a spec holds only torch.utils._pytree.TreeSpec, LeafSpec and container "
        "types, and loading a file never runs code from it.")
    with pytest.raises(CheckpointError, match="names posix.system"):
        describe(path)
    assert not marker.exists()
    pickle.loads(evil)  # what an unrestricted unpickler (dill.loads in the real package) would do
    assert marker.exists()


def test_the_spec_unpickler_refuses_code_hidden_inside_a_valid_looking_tree_spec(tmp_path):
    path = tmp_path / "evil.h5"
    shutil.copy(FIXTURES / "ckpt_legacy_0_4.h5", path)
    with h5py.File(path, "r+") as f:
        spec = bytes.fromhex(f.attrs["__spec__"])
        # the spec's first container type, dill._dill._load_type('dict'), becomes a call of
        # subprocess.check_call('dict') (names of the same lengths keep the pickle's frames valid)
        assert spec.count(b"\x8c\ndill._dill\x94\x8c\n_load_type") == 1
        f.attrs["__spec__"] = spec.replace(b"\x8c\ndill._dill\x94\x8c\n_load_type",
                                           b"\x8c\nsubprocess\x94\x8c\ncheck_call").hex()
    with pytest.raises(CheckpointError, match=r"a pickle that names subprocess\.check_call, which "
                                              r"cstream refuses"):
        cstorch.load(path)
