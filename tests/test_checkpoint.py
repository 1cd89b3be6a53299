"""cstream.save / cstream.load: HDF5, bit-exact, no pickle, atomic, lazy; the ckpt command."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cstream
from cstream.saving import CheckpointError

REPO = Path(__file__).resolve().parents[1]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]


def bits(t: torch.Tensor) -> bytes:
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def special(dtype):
    if dtype.is_floating_point:
        t = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-3, -2.5])
        return t.to(dtype)
    if dtype.is_complex:
        return torch.tensor([1 + 2j, -0.0 - 0j, complex("nan+1j")], dtype=dtype)
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, 0, info.max], dtype=dtype)


def test_every_dtype_round_trips_bit_for_bit_with_shape(tmp_path):
    obj = {str(d): special(d) for d in DTYPES}
    obj["scalar"] = torch.tensor(3.5)
    obj["matrix"] = torch.randn(3, 4).to(torch.bfloat16)
    obj["empty"] = torch.zeros(0, 5)
    obj["strided"] = torch.arange(12).reshape(3, 4).t()
    cstream.save(obj, tmp_path / "c.h5")
    back = cstream.load(tmp_path / "c.h5")
    for k, v in obj.items():
        got = back[k]
        assert got.dtype == v.dtype and got.shape == v.shape, k
        assert bits(got) == bits(v), k


def test_nested_structures_and_non_tensor_values_keep_their_types(tmp_path):
    obj = {
        "model": {"layer.0/weight": torch.ones(2), "": torch.zeros(1)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}, 1: {}},
                      "param_groups": [{"lr": 0.1, "params": [0, 1], "nesterov": False,
                                        "name": None, "betas": (0.9, 0.999)}]},
        "global_step": 12, "flag": True, "ratio": 0.25, "text": "héllo/wörld", "raw": b"\x00\xff",
        "nothing": None, "tuple": (1, "a", (2.0, None)), "list": [], "huge": 2 ** 80,
    }
    cstream.save(obj, tmp_path / "c.h5")
    back = cstream.load(tmp_path / "c.h5")
    assert back["global_step"] == 12 and type(back["global_step"]) is int
    assert back["flag"] is True and back["nothing"] is None
    assert back["ratio"] == 0.25 and type(back["ratio"]) is float
    assert back["text"] == "héllo/wörld" and back["raw"] == b"\x00\xff"
    assert back["tuple"] == (1, "a", (2.0, None)) and type(back["tuple"][2]) is tuple
    assert back["list"] == [] and back["huge"] == 2 ** 80
    assert list(back["model"]) == ["layer.0/weight", ""]
    assert list(back["optimizer"]["state"]) == [0, 1]  # int keys stay int
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert torch.equal(back["optimizer"]["state"][0]["step"], torch.tensor(3.0))


def test_a_model_and_optimizer_reload_from_what_load_returns(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    cstream.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "c.h5")
    state = cstream.load(tmp_path / "c.h5")
    model2 = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.5, momentum=0.1)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    assert opt2.param_groups[0]["lr"] == 0.1


def test_unsupported_values_are_refused_with_the_key_path(tmp_path):
    with pytest.raises(TypeError, match=r"cannot store set at /a/b.*no pickle"):
        cstream.save({"a": {"b": {1, 2}}}, tmp_path / "c.h5")
    assert not (tmp_path / "c.h5").exists()
    assert not list(tmp_path.glob(".c.h5*"))  # no temporary file left behind


def test_loading_never_unpickles(tmp_path, monkeypatch):
    path = tmp_path / "c.h5"
    cstream.save({"w": torch.ones(2), "s": "x"}, path)
    with h5py.File(path, "a") as f:  # a crafted entry holding pickle bytes
        g = f["root"].create_dataset("evil", data=np.frombuffer(pickle.dumps(os.system), np.uint8))
        g.attrs["cstream.kind"] = "bytes"
        f["root"].attrs["cstream.keytypes"] = "str,str,str"

    def refuse(*a, **k):
        raise AssertionError("pickle used while loading")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    state = cstream.load(path)
    assert isinstance(state["evil"], bytes)  # stays bytes: nothing is executed
    assert torch.equal(state["w"], torch.ones(2))


@pytest.mark.parametrize("make", ["truncated", "garbage", "text", "plain_hdf5", "missing_attr"])
def test_broken_or_foreign_files_raise_a_clear_error_naming_the_path(tmp_path, make):
    path = tmp_path / "c.h5"
    cstream.save({"w": torch.randn(100, 100), "n": 1}, path)
    if make == "truncated":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif make == "garbage":
        data = bytearray(path.read_bytes())
        for i in range(0, len(data), 7):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    elif make == "text":
        path.write_text("not a checkpoint")
    elif make == "plain_hdf5":
        path.unlink()
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    elif make == "missing_attr":
        with h5py.File(path, "a") as f:
            del f["root/n"].attrs["cstream.kind"]
    with pytest.raises(CheckpointError, match=str(path)):
        state = cstream.load(path)
        state["w"]


def test_tensors_are_read_lazily_so_an_untouched_corrupt_tensor_does_not_matter(tmp_path):
    path = tmp_path / "c.h5"
    cstream.save({"good": torch.arange(5), "bad": torch.zeros(10)}, path)
    with h5py.File(path, "a") as f:
        f["root/bad"].attrs["cstream.dtype"] = "not-a-dtype"
    state = cstream.load(path)
    assert torch.equal(state["good"], torch.arange(5))  # reading one tensor reads only it
    with pytest.raises(CheckpointError, match="unknown dtype"):
        state["bad"]


def test_map_location_then_torch_save_converts_to_the_pickle_format(tmp_path):
    obj = {"w": torch.randn(3).to(torch.bfloat16), "step": 2}
    cstream.save(obj, tmp_path / "c.h5")
    state = cstream.load(tmp_path / "c.h5", map_location="cpu")
    torch.save(dict(state.items()), tmp_path / "c.pt")
    back = torch.load(tmp_path / "c.pt")
    assert bits(back["w"]) == bits(obj["w"]) and back["step"] == 2


def test_max_checkpoints_keeps_the_newest_files_of_the_run(tmp_path):
    backend = cstream.backend("CPU", max_checkpoints=2, artifact_dir=tmp_path)
    for step in (1, 2, 3, 4):
        cstream.save({"step": step}, tmp_path / f"ckpt_{step}.h5")
    assert sorted(p.name for p in tmp_path.glob("*.h5")) == ["ckpt_3.h5", "ckpt_4.h5"]
    backend.shutdown()


KILL_SCRIPT = textwrap.dedent("""
    import sys, torch, cstream
    print("saving", flush=True)
    cstream.save({f"t{i}": torch.randn(256, 1024) for i in range(400)}, sys.argv[1])
""")


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "c.h5"
    cstream.save({"version": "old", "w": torch.ones(3)}, path)
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "saving"
    time.sleep(0.4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = cstream.load(path)
    assert state["version"] == "old" and torch.equal(state["w"], torch.ones(3))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cstream.cli", *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_ckpt_inspect_and_convert_on_the_command_line(tmp_path):
    cstream.save({"model": {"weight": torch.ones(2, 3, dtype=torch.bfloat16)}, "step": 5},
                 tmp_path / "c.h5")
    out = _cli("ckpt", "inspect", str(tmp_path / "c.h5"))
    assert out.returncode == 0, out.stderr
    assert "model/weight  bfloat16  (2, 3)" in out.stdout and "step" in out.stdout
    assert "1 tensors, 12 B" in out.stdout
    out = _cli("ckpt", "convert", str(tmp_path / "c.h5"), str(tmp_path / "c.pt"))
    assert out.returncode == 0, out.stderr
    back = torch.load(tmp_path / "c.pt")
    assert back["step"] == 5 and back["model"]["weight"].dtype == torch.bfloat16


def test_ckpt_errors_are_one_line(tmp_path):
    out = _cli("ckpt", "inspect", str(tmp_path / "missing.h5"))
    assert out.returncode == 2
    assert out.stderr.strip() == f"cstream ckpt: error: no checkpoint at {tmp_path / 'missing.h5'}"
    (tmp_path / "x.h5").write_text("nope")
    out = _cli("ckpt", "inspect", str(tmp_path / "x.h5"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# -- fuzzing ------------------------------------------------------------------------------------
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
    st.binary(max_size=8),
    st.builds(lambda n, d: torch.arange(n).to(d), st.integers(0, 6), st.sampled_from(DTYPES[:-1])),
)
trees = st.recursive(
    leaves,
    lambda c: st.one_of(st.lists(c, max_size=3), st.tuples(c, c),
                        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(0, 9)), c,
                                        max_size=3)),
    max_leaves=12,
)


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and bits(a) == bits(b)
    if isinstance(a, dict):
        return type(b) in (dict, cstream.saving.LazyDict) and list(a) == list(b) and all(
            _equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trees)
def test_generated_structures_round_trip(tmp_path, obj):
    cstream.save(obj, tmp_path / "f.h5")
    assert _equal(obj, cstream.load(tmp_path / "f.h5"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_files_load_or_raise_only_the_documented_error(tmp_path, flips):
    path = tmp_path / "m.h5"
    if not path.exists():
        cstream.save({"a": torch.arange(10), "b": {"c": "text", 1: (2.5, None)}}, path)
    data = bytearray(path.read_bytes())
    for pos, value in flips:
        data[pos % len(data)] = value
    mutated = tmp_path / "mut.h5"
    mutated.write_bytes(bytes(data))
    try:
        state = cstream.load(mutated)
        cstream.saving.to_eager(state)
    except CheckpointError:
        pass
