"""cstream.save / cstream.load: the real package's HDF5 layout, bit-exact, typed, atomic, lazy,
checked, and no code run from a file."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import cstream
from cstream.checkpoint import guard
from cstream.checkpoint.saving import CheckpointError, describe, layout
from helpers.checkpoint_files import values_offset, write_unsealed

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "reference" / "fixtures"


def bits(t: torch.Tensor) -> bytes:
    t = t.detach().reshape(-1).contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def nan_with_payload(dtype) -> torch.Tensor:
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    pattern = {2: 0x7E5A, 4: 0x7FC0_1234, 8: 0x7FF8_0000_DEAD_BEEF}[dtype.itemsize]
    return torch.tensor([pattern, -pattern], dtype=int_type).view(dtype)


def special_values(dtype) -> torch.Tensor:
    if dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        t = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e-3, -2.5]).to(dtype)
        return torch.cat([t, nan_with_payload(dtype)])
    if dtype.is_floating_point:  # float8 variants: every bit pattern
        return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    if dtype.is_complex:
        return torch.tensor([1 + 2j, complex(-0.0, -0.0), complex(math.nan, 1)]).to(dtype)
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, 0, info.max], dtype=dtype)


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool,
          torch.complex64, torch.complex128, torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_every_dtype_round_trips_bit_for_bit_with_its_shape(tmp_path):
    obj = {str(d): special_values(d) for d in DTYPES}
    obj["0-d"] = torch.tensor(3.5)
    obj["0-d bf16"] = torch.tensor(-0.0, dtype=torch.bfloat16)
    obj["matrix"] = torch.randn(3, 4).to(torch.bfloat16)
    obj["empty"] = torch.zeros(0, 5, dtype=torch.int64)
    obj["strided"] = torch.arange(12).reshape(3, 4).t()
    cstream.save(obj, tmp_path / "c.h5")
    back = cstream.load(tmp_path / "c.h5")
    assert list(back) == list(obj)
    for k, v in obj.items():
        got = back[k]
        assert type(got) is torch.Tensor and got.dtype == v.dtype and got.shape == v.shape, k
        assert bits(got) == bits(v.contiguous()), k


def test_nested_structures_and_plain_values_keep_their_types_and_order(tmp_path):
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_1234))[0]
    obj = {
        "model": {"layer.0/weight": torch.ones(2), "": torch.zeros(1), "%41": 1, "..": 3},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}, 1: {}},
                      "param_groups": [{"lr": 0.1, "params": [0, 1], "nesterov": False,
                                        "name": None, "betas": (0.9, 0.999)}]},
        1: "int key", -5: "negative", 2 ** 70: "huge key",
        "global_step": 12, "flag": True, "ratio": 0.25, "minus zero": -0.0, "nan": nan,
        "text": "héllo/wörld\x00\n", "lone surrogate value": "\udfff", "raw": b"\x00\xff",
        "array": bytearray(b"ab"), "nothing": None, "tuple": (1, "a", (2.0, None)), "list": [],
        "empty tuple": (), "huge": -(2 ** 80), "int64 edge": -(2 ** 63), "complex": 1 - 2j,
        "dtype": torch.bfloat16,
    }
    cstream.save(obj, tmp_path / "c.h5")
    back = cstream.load(tmp_path / "c.h5")
    assert list(back) == list(obj)
    assert list(back["model"]) == ["layer.0/weight", "", "%41", ".."]
    assert back[1] == "int key" and back[-5] == "negative"
    assert back[2 ** 70] == "huge key"
    assert list(back["optimizer"]["state"]) == [0, 1]
    assert back["optimizer"]["param_groups"][0] == obj["optimizer"]["param_groups"][0]
    assert type(back["optimizer"]["param_groups"][0]["betas"]) is tuple
    for key in ("global_step", "flag", "ratio", "text", "raw", "nothing", "tuple", "list",
                "empty tuple", "huge", "int64 edge", "lone surrogate value", "complex", "dtype"):
        assert back[key] == obj[key] and type(back[key]) is type(obj[key]), key
    assert back["array"] == b"ab" and type(back["array"]) is bytes  # bytearray is stored as bytes
    assert struct.pack("<d", back["minus zero"]) == struct.pack("<d", -0.0)
    assert math.isnan(back["nan"])  # the layout keeps numbers as JSON text: a NaN's payload is lost
    assert type(back["tuple"][2]) is tuple and back["tuple"][2][1] is None


@pytest.mark.parametrize("obj, message", [
    ({"a.b": 1, "a": {"b": 2}}, "cstream.save cannot store both a.b and a/b: the checkpoint layout "
                                "names every value by its dotted key path and both are 'a.b'."),
    ({1: "x", "1": "y"}, "cstream.save cannot store both [1] and 1:"),
    ({"k\ud800": 1}, "cstream.save cannot store the value at k\ud800: its key path 'k\\ud800' holds "
                     "a NUL or a lone surrogate"),
])
def test_keys_the_layout_cannot_tell_apart_or_name_are_refused(tmp_path, obj, message):
    with pytest.raises(ValueError) as info:
        cstream.save(obj, tmp_path / "c.h5")
    assert str(info.value).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_a_model_and_its_optimizer_reload_from_what_load_returns(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    cstream.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "c.h5")
    state = cstream.load(tmp_path / "c.h5")
    model2 = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert bits(a) == bits(b), name
    assert opt2.param_groups[0]["lr"] == 0.01
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert bits(opt.state[p]["exp_avg"]) == bits(opt2.state[p2]["exp_avg"])
        assert bits(opt.state[p]["step"]) == bits(opt2.state[p2]["step"])


def test_a_loaded_dict_hands_out_only_real_tensors_through_every_dict_operation(tmp_path):
    cstream.save({"a": torch.ones(2), "b": torch.zeros(3), "n": 4}, tmp_path / "c.h5")

    def check(d):
        assert all(type(v) is torch.Tensor for k, v in d.items() if k != "n"), d

    load = lambda: cstream.load(tmp_path / "c.h5")  # noqa: E731
    check(dict(load()))
    check({**load()})
    check(load().copy())
    check(copy.deepcopy(load()))
    check(load() | {})
    check({} | load())
    check(dict(zip(load().keys(), load().values())))
    state = load()
    assert type(state.pop("a")) is torch.Tensor and type(state.popitem()[1]) is int
    assert type(state.get("b")) is torch.Tensor and state.get("x", 7) == 7
    assert load() != {"n": 4}
    cstream.save({"t": torch.ones(1), "n": 4}, tmp_path / "one.h5")
    assert cstream.load(tmp_path / "one.h5") == {"t": torch.ones(1), "n": 4}  # compares values
    assert cstream.load(tmp_path / "one.h5") != {"t": torch.zeros(1), "n": 4}
    assert isinstance(load(), dict)
    assert repr(load()) == "{'a': tensor([1., 1.]), 'b': tensor([0., 0., 0.]), 'n': 4}"


def test_tensor_subclasses_and_parameters_are_saved_as_their_values(tmp_path):
    class Tagged(torch.Tensor):
        pass

    param = torch.nn.Parameter(torch.arange(4.0))
    tagged = torch.arange(3).as_subclass(Tagged)
    cstream.save({"param": param, "tagged": tagged}, tmp_path / "c.h5")
    back = cstream.load(tmp_path / "c.h5")
    assert type(back["param"]) is torch.Tensor and not back["param"].requires_grad
    assert torch.equal(back["param"], torch.arange(4.0))
    assert type(back["tagged"]) is torch.Tensor and torch.equal(back["tagged"], torch.arange(3))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("obj, message", [
    ({"a": {"b": {1, 2}}}, "cstream.save cannot store set at a/b: checkpoints hold torch.Tensor, "
                           "dict (str or int keys), list, tuple, str, int, float, bool, None, and "
                           "(pickled, as cerebras.pytorch does) bytes, complex and torch.dtype."),
    ({"opt": [{"f": print}]}, "cstream.save cannot store builtin_function_or_method at opt[0]/f"),
    ({"x": {(1, 2): 3}}, "cstream.save cannot store the key (1, 2) (tuple) in the dict at x: dict "
                         "keys must be str or int."),
    ({"x": {True: 3}}, "cstream.save cannot store the key True (bool) in the dict at x"),
    (lambda: {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)},
     "cstream.save cannot store the torch.qint8 tensor at q: supported dtypes are bfloat16, bool"),
    ({"s": torch.eye(2).to_sparse()}, "cstream.save cannot store the torch.sparse_coo tensor at s: "
                                      "only dense tensors are stored. Convert it first with "
                                      ".to_dense()."),
    ({"m": torch.ones(2, device="meta")}, "cstream.save cannot store the tensor at m: it is on the "
                                          "meta device and has no values."),
    (np.float32(1.0), "cstream.save cannot store float32 at /"),
])
def test_unsupported_values_are_refused_naming_the_key_path_and_no_file_is_left(tmp_path, obj,
                                                                                   message):
    obj = obj() if callable(obj) else obj
    with pytest.raises(TypeError) as info:
        cstream.save(obj, tmp_path / "c.h5")
    assert str(info.value).startswith(message)
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor a temporary file


def test_save_refuses_file_objects_and_directories_with_the_fix(tmp_path):
    with pytest.raises(TypeError, match=r"cstream.save takes a file path \(str or os.PathLike\), "
                                        r"got BytesIO"):
        cstream.save({}, io.BytesIO())
    with pytest.raises(IsADirectoryError, match=f"{tmp_path} is a directory; pass a file path like "
                                                f"{tmp_path / 'checkpoint.h5'}"):
        cstream.save({}, tmp_path)


def test_a_saved_file_gets_the_usual_permissions_of_new_files(tmp_path):
    old = os.umask(0o027)
    try:
        cstream.save({"w": torch.ones(1)}, tmp_path / "c.h5")
    finally:
        os.umask(old)
    assert (tmp_path / "c.h5").stat().st_mode & 0o777 == 0o640


def test_the_file_is_the_real_packages_layout_with_one_dataset_per_tensor(tmp_path):
    cstream.save({"model": {"layer.0/w": torch.arange(6.0).reshape(2, 3),
                            "b": torch.ones(2, dtype=torch.bfloat16)}, "step": 3, 7: "seven"},
                 tmp_path / "c.h5")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f.attrs["__version__"] == 0.5 and f.attrs["__SUCCESS__"]
        assert f.attrs["__cstorch_version__"].startswith("cstream ")
        unflattened, treespec = json.loads(f.attrs["__spec__"])
        assert unflattened == {"model": {"layer.0/w": "*", "b": "*"}, "step": "*", "7": "*"}
        leaf = {"type": None, "context": None, "children_spec": []}
        assert json.loads(treespec) == [1, {
            "type": "builtins.dict", "context": '["model", "step", 7]', "children_spec": [
                {"type": "builtins.dict", "context": '["layer.0/w", "b"]',
                 "children_spec": [leaf, leaf]}, leaf, leaf]}]
        assert sorted(f) == ["%model.layer.0%2Fw", "model.b"]  # "/" cannot be in a name
        w = f["%model.layer.0%2Fw"]
        assert w.attrs["__NUMPY__"] and w.shape == (2, 3) and list(w.attrs["dtypes"]) == [
            "torch.float32"]
        meta = json.loads(f.attrs["model.layer.0/w.__metadata__"])["model.layer.0/w.__metadata__"]
        assert meta == {"__TORCH__": True, "shapes": [[2, 3]], "dtypes": ["torch.float32"],
                        "rtfx_dtypes": [11], "__TYPE__": "TorchTensorSerializer", "__NUMPY__": True,
                        "compressed": False, "key": "%model.layer.0%2Fw"}
        assert np.array_equal(w[()], np.arange(6.0, dtype=np.float32).reshape(2, 3))
        b = f["model.b"]
        assert b.dtype == np.int16 and list(b.attrs["dtypes"]) == ["torch.bfloat16"]
        assert b[()].tolist() == [0x3F80, 0x3F80]  # bfloat16 1.0, bit for bit, as int16
        assert json.loads(f.attrs["step.__metadata__"]) == {
            "__spec__": [{"step": "*"}, '[1, {"type": "builtins.dict", "context": "[\\"step\\"]", '
                                        '"children_spec": [{"type": null, "context": null, '
                                        '"children_spec": []}]}]'],
            "__objects__": ["step"],
            "step.__metadata__": {"scalar_value": 3, "__TYPE__": "ScalarSerializer",
                                  "__NONE__": True}}
        assert json.loads(f.attrs["7.__metadata__"])["7.__metadata__"]["string_value"] == "seven"


@contextlib.contextmanager
def _edited(path):
    """Edit a saved file with h5py, then seal it again as cstream.save would have: the contents of a
    crafted file, which a checksum does not keep out (whoever crafts a file can compute one)."""
    with h5py.File(path, "r+") as f:
        yield f
    with open(path, "r+b") as fh:
        fh.write(bytes(guard.USERBLOCK))
    guard.seal(path)


def _with_pickle(path, key, payload: bytes):
    """Replace the pickled bytes of the entry ``key`` (an ObjectSerializer dataset) by ``payload``."""
    with _edited(path) as f:
        f[key].attrs["__BYTES__"] = np.frombuffer(payload, dtype="V1")


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickled_entry_that_would_run_code_is_refused_naming_it_and_nothing_runs(tmp_path):
    path, marker = tmp_path / "c.h5", tmp_path / "marker"
    cstream.save({"w": torch.ones(2), "evil": b"placeholder"}, path)
    payload = pickle.dumps(_RunsCode(marker), protocol=4)
    pickle.loads(pickle.dumps(_RunsCode(tmp_path / "proof")))  # the payload does run when unpickled
    assert (tmp_path / "proof").exists()
    _with_pickle(path, "evil", payload)
    with pytest.raises(CheckpointError) as info:
        cstream.load(path)
    assert str(info.value).startswith(
        f"{path}: the entry evil is a pickled object that names posix.system, which cstream refuses "
        "to load: it unpickles only builtins.complex, builtins.set,")
    assert "so that loading a file never runs code from it" in str(info.value)
    with pytest.raises(CheckpointError, match="names posix.system"):
        describe(path)
    assert not marker.exists()


@pytest.mark.parametrize("payload, name", [
    (b"\x80\x04cbuiltins\neval\n(S'1+1'\ntR.", "builtins.eval"),
    (b"\x80\x04cdill._dill\n_load_type\n(S'function'\ntR.", "dill._dill._load_type('function')"),
    (b"\x80\x04ctorch\nload\n(S'x.pt'\ntR.", "torch.load"),
    (b"\x80\x04csubprocess\nPopen\n(S'true'\ntR.", "subprocess.Popen"),
])
def test_only_the_globals_a_real_file_pickles_are_admitted(tmp_path, payload, name):
    path = tmp_path / "c.h5"
    cstream.save({"x": b""}, path)
    _with_pickle(path, "x", payload)
    with pytest.raises(CheckpointError, match=f"names {re.escape(name)}, which cstream refuses"):
        cstream.load(path)
    # what dill writes for these values loads: complex via dill._dill._load_type, a dtype by name
    _with_pickle(path, "x", b"\x80\x04cdill._dill\n_load_type\n(S'complex'\ntR(G?\xf0\x00\x00\x00"
                            b"\x00\x00\x00G@\x00\x00\x00\x00\x00\x00\x00tR.")
    assert cstream.load(path)["x"] == 1 + 2j
    _with_pickle(path, "x", b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x05torch\x94"
                            b"\x8c\x07float16\x94\x93\x94.")
    assert cstream.load(path)["x"] is torch.float16


def _legacy_file(path):
    with h5py.File(path, "w") as f:
        f.attrs["__version__"] = 0.4
        f.attrs["__spec__"] = "80049500"  # a pickle cut off after its header


@pytest.mark.parametrize("make, what", [
    ("truncated half", "is not a readable checkpoint: it is truncated: it has "),
    ("empty", "is not a readable checkpoint: it is empty (0 bytes): its writer stopped before it "
              "wrote anything. Load an earlier checkpoint instead"),
    ("text", "it is not an HDF5 file"),
    ("plain hdf5", "it is an HDF5 file but not a checkpoint (it has no __version__ attribute); "
                   "write checkpoints with cstream.save or cerebras.pytorch.save."),
    ("legacy", "its tree spec cannot be unpickled ("),
    ("newer", "its layout version is 0.7; cstream reads version 0.5 (and the layouts of "
              "cerebras.pytorch 2.0 and earlier, 0.1 to 0.4)."),
    ("unfinished", "it was not written to the end (no __SUCCESS__ attribute)"),
    ("bad spec", "its attribute __spec__ is not valid JSON"),
    ("directory", "is a directory, not a checkpoint file."),
])
def test_broken_or_foreign_files_raise_a_checkpoint_error_naming_the_path(tmp_path, make, what):
    path = tmp_path / "c.h5"
    cstream.save({"w": torch.randn(100, 100), "n": 1}, path)
    data = bytearray(path.read_bytes())
    if make == "truncated half":
        path.write_bytes(data[: len(data) // 2])
    elif make == "empty":
        path.write_bytes(b"")
    elif make == "text":
        path.write_text("not a checkpoint")
    elif make == "plain hdf5":
        path.unlink()
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    elif make == "legacy":
        path.unlink()
        _legacy_file(path)
    elif make in ("newer", "unfinished", "bad spec"):
        with _edited(path) as f:
            if make == "newer":
                f.attrs["__version__"] = 0.7
            elif make == "unfinished":
                del f.attrs["__SUCCESS__"]
            else:
                f.attrs["__spec__"] = "[{"
    elif make == "directory":
        path.unlink()
        path.mkdir()
    with pytest.raises(CheckpointError) as info:
        cstream.load(path)
    assert str(info.value).startswith(f"{path}")
    assert what in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_missing_file_raises_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^no checkpoint at {tmp_path / 'nope.h5'}$"):
        cstream.load(tmp_path / "nope.h5")


def test_tensors_of_an_unsealed_file_are_read_lazily_so_an_untouched_damaged_one_does_not_matter(
        tmp_path):
    """A file cstream wrote before it sealed its files: each tensor's CRC-32 is checked when read."""
    path = tmp_path / "c.h5"
    write_unsealed({"good": torch.arange(5), "bad": torch.zeros(10), "more": {"x": torch.ones(3)}},
                   path)
    offset = values_offset(path, "bad")
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0x40  # one bit of the tensor's values
    path.write_bytes(data)
    state = cstream.load(path)  # reads the index only
    assert torch.equal(state["good"], torch.arange(5))
    assert torch.equal(state["more"]["x"], torch.ones(3))
    with pytest.raises(CheckpointError) as info:
        state["bad"]
    assert str(info.value) == (f"{path}: the tensor bad is corrupted: its data does not match its "
                               "checksum.")


def _mapped_file(address: int) -> str | None:
    """The file mapped into this process's memory at ``address`` (Linux's /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) == 6 else None
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_uncompressed_tensors_are_copy_on_write_views_of_the_mapped_file(tmp_path):
    path = tmp_path / "c.h5"
    w = torch.arange(4096.0).reshape(64, 64)
    cstream.save({"w": w, "b": w.to(torch.bfloat16), "s": torch.tensor(2)}, path, compress=False)
    before = path.read_bytes()
    state = cstream.load(path)
    for key in ("w", "b"):
        with h5py.File(path, "r") as f:  # contiguous, at a 64-byte boundary of the file
            offset = f[key].id.get_offset()
        assert offset % 64 == 0
        assert _mapped_file(state[key].data_ptr()) == str(path)  # its memory is the file, mapped
        assert torch.equal(state[key], w.to(state[key].dtype))
    state["w"].add_(1)  # changing a loaded tensor leaves the file as it was
    assert torch.equal(state["w"], w + 1)
    assert path.read_bytes() == before
    assert torch.equal(cstream.load(path)["w"], w)
    assert cstream.load(path)["s"].item() == 2


def test_compressed_tensors_are_lz4_chunks_the_real_package_writes_and_load_the_same(tmp_path):
    path = tmp_path / "c.h5"
    state = {"zeros": torch.zeros(512, 512), "w": torch.randn(300, 7, 5), "s": torch.tensor(1.5),
             "empty": torch.zeros(0, 2)}
    cstream.save(state, path)
    with h5py.File(path, "r") as f:
        # the chunks h5py picks (as it does for the real package), and hdf5plugin.LZ4()'s options
        for k in ("zeros", "w", "empty"):
            assert f[k].chunks == h5py.filters.guess_chunk(state[k].shape, None, 4)
        assert f["s"].chunks is None and f["s"].id.get_create_plist().get_nfilters() == 0
        plist = f["zeros"].id.get_create_plist()
        assert plist.get_nfilters() == 1 and plist.get_filter(0)[:3] == (32004, 1, (0,))
        assert f["zeros"].id.get_storage_size() < 512 * 512 * 4 // 100  # zeros take ~nothing
    loaded = cstream.load(path)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"cpu": "cpu"},
                                          lambda t, loc: t.double()])
def test_map_location_takes_what_torch_load_takes_for_the_cpu(tmp_path, map_location):
    cstream.save({"w": torch.ones(2), "l": [torch.zeros(1)]}, tmp_path / "c.h5")
    state = cstream.load(tmp_path / "c.h5", map_location=map_location)
    want = torch.float64 if callable(map_location) else torch.float32
    assert state["w"].device.type == "cpu" and state["w"].dtype == want
    assert state["l"][0].dtype == want


def test_a_bad_map_location_is_refused_before_reading(tmp_path):
    cstream.save({"w": torch.ones(2)}, tmp_path / "c.h5")
    with pytest.raises(ValueError, match=r"^cstream.load: map_location='gpu' is not a usable device "
                                         r"here \(.*\); use map_location=\"cpu\".$"):
        cstream.load(tmp_path / "c.h5", map_location="gpu")
    with pytest.raises(TypeError, match=r"map_location must be None, a device .* got int: 3"):
        cstream.load(tmp_path / "c.h5", map_location=3)


def test_map_location_cpu_then_torch_save_converts_to_the_pickle_format(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    obj = {"model": model.state_dict(), "optimizer": opt.state_dict(),
           "w": torch.randn(3).to(torch.bfloat16), "step": 2, "betas": (0.9, 0.99)}
    cstream.save(obj, tmp_path / "c.h5")
    state_dict = cstream.load(tmp_path / "c.h5", map_location="cpu")
    torch.save(state_dict, tmp_path / "c.pt")  # the porting guide's recipe, as written
    back = torch.load(tmp_path / "c.pt")  # weights_only=True: only plain types in the file
    assert bits(back["w"]) == bits(obj["w"]) and back["step"] == 2 and back["betas"] == (0.9, 0.99)
    model2 = torch.nn.Linear(3, 2)
    model2.load_state_dict(back["model"])
    assert torch.equal(model2.weight, model.weight)
    assert torch.equal(back["optimizer"]["state"][0]["momentum_buffer"],
                       opt.state_dict()["state"][0]["momentum_buffer"])


def test_max_checkpoints_keeps_only_the_newest_files_of_the_run(tmp_path):
    backend = cstream.backend("CPU", max_checkpoints=2, artifact_dir=tmp_path / "art")
    for step in (1, 2, 3, 4):
        cstream.save({"step": step}, tmp_path / f"ckpt_{step}.h5")
    cstream.save({"step": 3}, tmp_path / "ckpt_3.h5")  # re-saving a file makes it the newest
    cstream.save({"step": 5}, tmp_path / "ckpt_5.h5")
    assert sorted(p.name for p in tmp_path.glob("*.h5")) == ["ckpt_3.h5", "ckpt_5.h5"]
    assert cstream.load(tmp_path / "ckpt_5.h5") == {"step": 5}
    backend.shutdown()


def test_describe_lists_entries_without_reading_tensor_values(tmp_path):
    path = tmp_path / "c.h5"
    cstream.save({"model": {"w": torch.ones(2, 3, dtype=torch.bfloat16)}, "groups": [{"lr": 0.5}],
                  "e": {}, "n": None}, path)
    offset = values_offset(path, "model.w")
    with open(path, "r+b") as fh:  # damaged values (behind a matching seal) are never read
        fh.seek(offset)
        fh.write(b"\xff")
        fh.seek(0)
        fh.write(bytes(guard.USERBLOCK))
    guard.seal(path)
    assert describe(path) == [
        {"key": "model/w", "type": "tensor", "dtype": "bfloat16", "shape": (2, 3), "nbytes": 12},
        {"key": "groups[0]/lr", "type": "float", "value": 0.5},
        {"key": "e", "type": "dict", "value": {}},
        {"key": "n", "type": "NoneType", "value": None},
    ]


KILL_SCRIPT = textwrap.dedent("""
    import sys, torch, cstream
    big = {f"t{i}": torch.full((256, 1024), float(i)) for i in range(400)}
    print("saving", flush=True)
    cstream.save(big, sys.argv[1])
    print("saved", flush=True)
""")


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "c.h5"
    cstream.save({"version": "old", "w": torch.ones(3)}, path)
    before = path.read_bytes()
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "saving"
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".c.h5.*.tmp")):  # the write has begun
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == before
    state = cstream.load(path)
    assert state["version"] == "old" and torch.equal(state["w"], torch.ones(3))
    assert [p.name for p in tmp_path.glob("*.h5")] == ["c.h5"]


def test_a_file_in_cstreams_earlier_layout_still_loads_and_describes():
    """tests/data/cstream_v2_layout.h5 was written by cstream.save before it wrote the real layout."""
    path = REPO / "tests" / "data" / "cstream_v2_layout.h5"
    state = cstream.load(path)
    assert list(state) == ["model", "optimizer", "global_step", "note", "raw", "ids"]
    assert bits(state["model"]["weight"]) == bits(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    bias = state["model"]["bias"]
    assert bias.dtype == torch.bfloat16 and bits(bias) == bits(torch.tensor([0.5, -1.5],
                                                                            dtype=torch.bfloat16))
    opt = state["optimizer"]
    assert list(opt["state"]) == [0] and torch.equal(opt["state"][0]["step"], torch.tensor(3.0))
    assert opt["state"][0]["exp_avg"].dtype == torch.float16
    assert opt["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0], "name": None,
                                    "amsgrad": False}]
    assert state["global_step"] == 12 and state["raw"] == b"\x00\xff"
    assert state["note"] == "written by cstream 0.1.0 (layout version 2)"
    assert torch.equal(state["ids"], torch.tensor([1, -2, 3]))
    assert describe(path)[1] == {"key": "model/bias", "type": "tensor", "dtype": "bfloat16",
                                 "shape": (2,), "nbytes": 4}


def test_a_file_in_the_earlier_layout_saves_again_in_the_real_layout(tmp_path):
    old = cstream.load(REPO / "tests" / "data" / "cstream_v2_layout.h5")
    cstream.save(old, tmp_path / "new.h5")
    with h5py.File(tmp_path / "new.h5", "r") as f:
        assert f.attrs["__version__"] == 0.5
    new = cstream.load(tmp_path / "new.h5")
    assert bits(new["model"]["bias"]) == bits(old["model"]["bias"])
    assert new["optimizer"]["param_groups"] == old["optimizer"]["param_groups"]


# -- damaged files: refused before HDF5 reads them -------------------------------------------------
def _advice(path) -> str:
    return (f" Load an earlier checkpoint instead: `cstream ckpt inspect {path.parent}` lists the "
            "checkpoints there and which of them are intact.")


def test_save_seals_the_file_with_its_length_and_checksum_in_a_user_block_hdf5_skips(tmp_path):
    path = tmp_path / "c.h5"
    cstream.save({"w": torch.arange(100.0), "n": 3}, path)
    data = path.read_bytes()
    tag, version, userblock, length, crc = struct.unpack_from("<24sIIQI", data)
    assert (tag, version, userblock, length) == (b"\x89CSTREAM-H5-CHECKSUM\r\n\x1a\n", 1, 512, len(data))
    assert crc == zlib.crc32(data[512:])
    assert struct.unpack_from("<I", data, 508)[0] == zlib.crc32(data[:508])
    assert data[512:520] == b"\x89HDF\r\n\x1a\n"
    with h5py.File(path, "r") as f:  # any HDF5 reader skips the block
        assert f.userblock_size == 512 and f.attrs["__version__"] == 0.5


def _damage(path, region: str) -> None:
    data = bytearray(path.read_bytes())
    values = values_offset(path, "w")
    at = {"superblock": 512 + 20, "global heap": data.find(b"GCOL") + 40, "data": values + 5,
          "header length": 40, "header tag": 1}[region]
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("region, what", [
    ("superblock", "its contents do not match the checksum in its header (CRC-32 {got}, written "
                   "{crc}): the file was damaged after it was written."),
    ("global heap", "its contents do not match the checksum in its header (CRC-32 {got}, written "
                    "{crc}): the file was damaged after it was written."),
    ("data", "its contents do not match the checksum in its header (CRC-32 {got}, written {crc}): "
             "the file was damaged after it was written."),
    ("header length", "its header (the first 512 bytes, which hold the file's length and checksum) "
                      "is damaged: it does not match its own CRC-32."),
    ("header tag", "its first 512 bytes, the header cstream.save writes, are damaged (they do not "
                   "start with cstream's tag b'\\x89CSTREAM-H5-CHECKSUM\\r\\n\\x1a\\n')."),
])
def test_a_flipped_byte_anywhere_in_a_sealed_file_is_refused_before_hdf5_reads_it(
        tmp_path, region, what):
    path = tmp_path / "c.h5"
    cstream.save({"w": torch.arange(100.0), "n": 3, "s": "text"}, path)
    crc = zlib.crc32(path.read_bytes()[512:])
    _damage(path, region)
    got = zlib.crc32(path.read_bytes()[512:])
    message = (f"{path} is not a readable checkpoint: "
               + what.format(got=f"{got:08x}", crc=f"{crc:08x}") + _advice(path))
    for read in (cstream.load, describe, layout):
        with pytest.raises(CheckpointError) as info:
            read(path)
        assert str(info.value) == message


@pytest.mark.parametrize("change, what", [
    ("cut 100", "it is truncated: it has {short} bytes, its header records the {n} bytes written."),
    ("cut to 600", "it is truncated: it has 600 bytes, its header records the {n} bytes written."),
    ("cut to 300", "it is truncated: it has 300 bytes, fewer than its 512-byte header."),
    ("append", "it has {long} bytes, 3 more than the {n} bytes its header records (something was "
               "appended to it)."),
])
def test_a_truncated_or_extended_sealed_file_is_refused_naming_both_lengths(tmp_path, change, what):
    path = tmp_path / "c.h5"
    cstream.save({"w": torch.arange(100.0)}, path)
    data = path.read_bytes()
    n = len(data)
    new = {"cut 100": data[:-100], "cut to 600": data[:600], "cut to 300": data[:300],
           "append": data + b"abc"}[change]
    path.write_bytes(new)
    with pytest.raises(CheckpointError) as info:
        cstream.load(path)
    assert str(info.value) == (f"{path} is not a readable checkpoint: "
                               + what.format(short=n - 100, long=n + 3, n=n) + _advice(path))


def test_the_damaged_global_heap_of_an_unsealed_file_is_refused_before_hdf5_loops_on_it(tmp_path):
    """The real package's files carry no checksum: the free-space object of a global heap
    collection set to 40 bytes (as in tests/data/corrupt_global_heap.h5) leaves an object of size
    0 after it, where HDF5's reader would loop for ever; cstream's walk of the heap refuses it."""
    path = tmp_path / "real.h5"
    data = bytearray((REPO / "tests/reference/fixtures/ckpt_real_state.h5").read_bytes())
    gcol = data.find(b"GCOL")
    size = struct.unpack_from("<Q", data, gcol + 8)[0]
    p = gcol + 16
    while struct.unpack_from("<H", data, p)[0] != 0:  # to the free space (index 0)
        p += 16 + (struct.unpack_from("<Q", data, p + 8)[0] + 7 & ~7)
    assert p < gcol + size
    struct.pack_into("<Q", data, p + 8, 40)
    struct.pack_into("<HHIQ", data, p + 40, 0, 0, 0, 0)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        cstream.load(path)
    assert str(info.value) == (
        f"{path} is not a readable checkpoint: the global heap collection at byte {gcol} is "
        f"damaged: its object at byte {p + 40} has size 0; HDF5 would loop for ever or read past it."
        + _advice(path))


@pytest.mark.parametrize("window", [4096, 8192])
def test_the_heap_scan_finds_a_collection_whose_signature_straddles_two_windows(tmp_path, monkeypatch,
                                                                               window):
    """The scan maps the file in windows (16 MiB); a ``GCOL`` cut by a window's end is found too."""
    monkeypatch.setattr(guard, "_WINDOW", window)
    path = REPO / "tests" / "data" / "corrupt_global_heap.h5"
    with pytest.raises(CheckpointError, match="the global heap collection at byte 10240 is damaged"):
        cstream.load(path)
    data = bytearray(3 * window + 100)
    for at in (0, window - 3, 2 * window - 1, 3 * window - 2, 3 * window + 96):  # 3 cut by an end
        data[at:at + 4] = b"GCOL"
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb") as f:
        assert list(guard._signatures(f, b"GCOL")) == [
            i for i in range(len(data)) if data.startswith(b"GCOL", i)]
        assert len(list(guard._signatures(f, b"GCOL"))) == 5
        for start, length in ((0, len(data)), (512, len(data)), (window + 5, window), (7, 0)):
            assert guard._crc32(f, start, length) == zlib.crc32(data[start:start + length])


def test_a_damaged_object_header_of_an_unsealed_file_is_read_by_a_child_process_first(tmp_path):
    """Layout 0.4 as the real package wrote it (superblock 0, object headers without checksums): a
    byte of an attribute's variable-length type changed makes HDF5 fault in the process reading
    it; that process is the probe, so the caller gets an error."""
    path = tmp_path / "legacy.h5"
    data = bytearray((FIXTURES / "ckpt_legacy_0_4.h5").read_bytes())
    data[11993] = 56
    path.write_bytes(bytes(data))
    for read in (cstream.load, describe):
        with pytest.raises(CheckpointError) as info:
            read(path)
        assert str(info.value).startswith(f"{path} is not a readable checkpoint: HDF5 ")
        assert str(info.value).endswith(_advice(path))
    assert cstream.load(FIXTURES / "ckpt_legacy_0_4.h5")["step"] == 2  # the next probe answers


def test_a_structure_hdf5_reads_for_ever_is_cut_off_by_the_probes_time_limit(tmp_path):
    """The probe itself bounded: on the damaged global heap (which the heap walk refuses before
    any probe) HDF5 loops for ever, and the probe is killed after its limit."""
    path = REPO / "tests" / "data" / "corrupt_global_heap.h5"
    with pytest.raises(CheckpointError) as info:
        guard.probe(str(path), timeout_s=3)
    assert str(info.value) == (
        f"{path} is not a readable checkpoint: HDF5 did not finish reading its structure within "
        "3 s (a damaged file can keep HDF5 busy for ever)." + _advice(path))
