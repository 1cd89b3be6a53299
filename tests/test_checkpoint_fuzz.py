"""Fuzzing cstream.save / cstream.load: generated structures round-trip exactly (or are refused for
keys the layout cannot tell apart), and damaged files either load the original values or raise
CheckpointError (never wrong values, a crash or a hang). The mutations are a fixed sequence
(``derandomize``): one damaged global heap makes HDF5 loop for ever (the strict xfail at the
end), and a random draw that hit such a file would hang the suite."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cstream
from cstream.saving import CheckpointError, to_eager

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def bits(t: torch.Tensor) -> bytes:
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a, b) -> bool:
    """Equal values of equal types; tensors and floats compared bit for bit."""
    if isinstance(a, torch.Tensor):
        return (type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
                and bits(a) == bits(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float):  # numbers are JSON text in the layout: a NaN's sign and payload are lost
        return type(b) is float and (struct.pack("<d", a) == struct.pack("<d", b)
                                     or math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


tensors = st.builds(
    lambda shape, dtype, seed: (torch.randn(shape, generator=torch.Generator().manual_seed(seed))
                                * 100).to(dtype),
    st.lists(st.integers(0, 3), max_size=3), st.sampled_from(DTYPES), st.integers(0, 2 ** 16))
leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                   st.binary(max_size=8), tensors)
keys = st.one_of(st.text(max_size=5), st.text(alphabet="0123%./", max_size=3), st.integers(-3, 9))
trees = st.recursive(
    leaves,
    lambda c: st.one_of(st.lists(c, max_size=3), st.tuples(c, c),
                        st.dictionaries(keys, c, max_size=4)),
    max_leaves=12,
)


@FUZZ
@given(trees)
def test_generated_structures_round_trip_exactly(tmp_path, obj):
    try:
        cstream.save(obj, tmp_path / "f.h5")
    except ValueError as e:  # two keys with the same dotted path ({1: a, "1": b}), or a NUL in a key
        assert "dotted key path" in str(e) or "holds a NUL" in str(e)
        return
    assert same(obj, to_eager(cstream.load(tmp_path / "f.h5")))


ORIGINAL = {"a": torch.arange(10), "w": torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),
            "b": {"c": "text", 1: (2.5, None), "2": [True, b"\x00"]}}


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "valid.h5"
    cstream.save(ORIGINAL, path)
    return path.read_bytes()


def load_or_error(path) -> object:
    try:
        return to_eager(cstream.load(path))  # touches every tensor
    except CheckpointError as e:
        assert str(e).startswith(str(path))
        return e


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 2 ** 20), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, 2 ** 20))
def test_mutated_files_load_the_original_values_or_raise_only_the_documented_error(
        tmp_path, valid_file, flips, cut):
    data = bytearray(valid_file)
    for pos, value in flips:
        data[pos % len(data)] = value
    if cut % 4 == 0:  # some files are truncated too
        data = data[: cut % len(data)]
    path = tmp_path / "mutated.h5"
    path.write_bytes(bytes(data))
    result = load_or_error(path)
    assert isinstance(result, CheckpointError) or same(ORIGINAL, result)


def test_every_single_byte_change_is_harmless_or_detected(tmp_path, valid_file):
    path = tmp_path / "flipped.h5"
    detected = 0
    for pos in range(0, len(valid_file), 3):
        data = bytearray(valid_file)
        data[pos] ^= 0xA5
        path.write_bytes(bytes(data))
        result = load_or_error(path)
        detected += isinstance(result, CheckpointError)
        assert isinstance(result, CheckpointError) or same(ORIGINAL, result), pos
    assert detected > 0


def test_every_prefix_of_the_header_is_refused_as_truncated(tmp_path):
    cstream.save({"w": torch.ones(2)}, tmp_path / "f.h5")
    data = (tmp_path / "f.h5").read_bytes()
    for n in range(0, 64):
        (tmp_path / "cut.h5").write_bytes(data[:n])
        with pytest.raises(CheckpointError):
            cstream.load(tmp_path / "cut.h5")


@pytest.mark.xfail(strict=True, reason="HDF5 loops for ever reading a variable-length string "
                   "attribute whose global-heap entry a mutation damaged; the load cannot be "
                   "bounded from Python (the loop never returns to the interpreter)")
def test_a_file_with_a_damaged_global_heap_is_refused_not_read_for_ever():
    """A mutation found by the fuzz test above: the ``b.2.1.__metadata__`` attribute's heap entry
    is damaged. The load runs in its own process, bounded to 30 s."""
    import subprocess
    import sys

    path = Path(__file__).parent / "data" / "corrupt_global_heap.h5"
    code = ("import sys\nimport cstream\nfrom cstream.saving import CheckpointError\n"
            "try:\n    cstream.load(sys.argv[1])\n"
            "except CheckpointError:\n    print('refused')\n")
    try:
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                             text=True, timeout=30,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    except subprocess.TimeoutExpired:
        pytest.fail("loading the damaged file did not end within 30 s")
    assert out.stdout.strip() == "refused", out.stderr[-2000:]
