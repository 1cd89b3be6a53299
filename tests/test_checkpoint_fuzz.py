"""Fuzzing cstream.save / cstream.load: generated structures round-trip exactly (or are refused for
keys the layout cannot tell apart), and damaged files either load or raise CheckpointError, within
a bound, never a crash, another exception or a hang.

Damaged files are read in a child process (:class:`Reader`) that the test kills if one read takes
longer than :data:`BOUND_S`, so a file that made HDF5 loop for ever would fail the test, not hang
the suite. The mutations are drawn at random, from a seed drawn per run (``CSTREAM_FUZZ_SEED``
replays one; ``CSTREAM_FUZZ_DRAWS`` draws more), over cstream's sealed files, a cstream file
without the seal (as cstream wrote before it sealed them) and files the real package wrote.
"""

from __future__ import annotations

import json
import math
import os
import random
import select
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cstream
from cstream.checkpoint import guard
from cstream.checkpoint.saving import CheckpointError, to_eager
from helpers.checkpoint_files import write_unsealed
from helpers.cli import child_env

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "reference" / "fixtures"
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
BOUND_S = 20.0  # one read of a 240 KB file takes milliseconds; the rest is room for a busy machine
DRAWS = int(os.environ.get("CSTREAM_FUZZ_DRAWS", "1000"))


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

# The child: reads a path per line, describes and loads the file (every tensor), answers one line
# of JSON: what it loaded (the SHA-256 of its record), the CheckpointError, or another exception.
# The answers go to a copy of its stdout; stdout itself goes to stderr, because HDF5's LZ4 filter
# prints to it ("cannot malloc") when a damaged chunk claims a size it cannot allocate.
READER = r"""
import hashlib, json, os, resource, sys
sys.stdout = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a damaged size must not take the host
import cstream
from cstream.checkpoint.saving import CheckpointError, describe, to_eager
from reference.records import record
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    path = line.rstrip("\n")
    try:
        describe(path)
        loaded = record(to_eager(cstream.load(path)))
        answer = {"loaded": hashlib.sha256(json.dumps(loaded).encode()).hexdigest()}
    except CheckpointError as e:
        answer = {"refused": str(e)}
    except BaseException as e:
        answer = {"raised": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer), flush=True)
"""


class Reader:
    """A child process that reads checkpoints; :meth:`read` waits at most ``bound_s`` for one."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=child_env())
        assert self._answer(120.0, "the reader to import cstream") == {"ready": True}

    def _answer(self, bound_s: float, what: str) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], bound_s)
        if not ready:
            self.close()
            raise TimeoutError(f"waited {bound_s:.0f} s for {what}; the reader was killed")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"the reader died (exit status {self.proc.returncode}) during {what}: "
                               f"{self.proc.stderr.read()[-2000:]}")
        return json.loads(line)

    def read(self, path: Path, bound_s: float = BOUND_S) -> dict:
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        return self._answer(bound_s, f"a read of {path}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def reader():
    r = Reader()
    yield r
    r.close()


@dataclass
class Base:
    """A valid file to damage: its bytes, the ranges that are not tensor values, and whether cstream
    sealed it (then every change must be refused)."""

    name: str
    data: bytes
    metadata: list[tuple[int, int]]
    sealed: bool


def _value_ranges(path: Path) -> list[tuple[int, int]]:
    """Where the tensors' values (contiguous data or chunks) lie in the file."""
    out = []

    def visit(_, obj):
        if isinstance(obj, h5py.Dataset) and obj.shape:
            if obj.chunks:
                for i in range(obj.id.get_num_chunks()):
                    info = obj.id.get_chunk_info(i)
                    out.append((info.byte_offset, info.byte_offset + info.size))
            elif obj.id.get_storage_size():
                out.append((obj.id.get_offset(), obj.id.get_offset() + obj.id.get_storage_size()))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return sorted(out)


def _base(name: str, path: Path) -> Base:
    data = path.read_bytes()
    metadata, at = [], 0
    for start, end in _value_ranges(path):
        if start > at:
            metadata.append((at, start))
        at = max(at, end)
    metadata.append((at, len(data)))
    return Base(name, data, metadata, guard.is_sealed(data))


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[Base]:
    folder = tmp_path_factory.mktemp("bases")
    cstream.save(ORIGINAL, folder / "sealed.h5")
    write_unsealed(ORIGINAL, folder / "unsealed.h5")
    files = [("cstream sealed", folder / "sealed.h5"), ("cstream unsealed", folder / "unsealed.h5")]
    files += [(f"real {n}", FIXTURES / f"{n}.h5") for n in ("ckpt_real_state", "ckpt_real_adam_sched",
                                                            "ckpt_legacy_0_4")]
    return [_base(name, path) for name, path in files]


def _mutate(rng: random.Random, base: Base) -> tuple[bytes, list]:
    """1 to 8 bytes set (3 in 4 of them outside the tensors' values), a file cut short 1 time in 4."""
    data, steps = bytearray(base.data), []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.75:
            start, end = rng.choice(base.metadata)
            pos = rng.randrange(start, end)
        else:
            pos = rng.randrange(len(data))
        value = rng.randrange(256) if rng.random() < 0.5 else data[pos] ^ (1 << rng.randrange(8))
        data[pos] = value
        steps.append(("set", pos, value))
    if rng.random() < 0.25:
        cut = rng.randrange(len(data))
        data = data[:cut]
        steps.append(("cut", cut))
    return bytes(data), steps


def test_random_mutations_of_every_kind_of_file_load_or_are_refused_within_the_bound(
        tmp_path, bases, reader):
    seed = int(os.environ.get("CSTREAM_FUZZ_SEED", random.SystemRandom().randrange(2 ** 32)))
    rng = random.Random(seed)
    replay = f"(seed {seed}: rerun with CSTREAM_FUZZ_SEED={seed})"
    originals = {}
    for i, base in enumerate(bases):
        (tmp_path / f"base{i}.h5").write_bytes(base.data)
        originals[base.name] = reader.read(tmp_path / f"base{i}.h5")
        assert "loaded" in originals[base.name], (base.name, originals[base.name])
    counts = {"loaded": 0, "refused": 0}
    for draw in range(DRAWS):
        base = rng.choice(bases)
        data, steps = _mutate(rng, base)
        # a new file each time: HDF5 shares what it read of a file still open under the same inode
        path = tmp_path / f"mutated{draw}.h5"
        path.write_bytes(data)
        what = f"draw {draw} of {base.name}, mutations {steps} {replay}"
        try:
            answer = reader.read(path)
        except (TimeoutError, RuntimeError) as e:
            pytest.fail(f"{e}: {what}")
        assert "raised" not in answer, f"{answer['raised']}: {what}"
        if "refused" in answer:
            assert answer["refused"].startswith(f"{path} ") or answer["refused"].startswith(
                f"{path}: "), (answer, what)
        elif base.sealed:  # cstream's checksum covers every byte
            assert data == base.data, f"a damaged sealed file loaded: {what}"
        elif data == base.data:
            assert answer == originals[base.name], what
        counts[next(iter(answer))] += 1
        path.unlink()
    assert counts["refused"] > DRAWS // 4, counts  # most draws damage something HDF5 or cstream checks
    print(f"{DRAWS} draws {replay}: {counts}")


def test_a_legacy_spec_whose_string_length_overflows_is_refused_naming_the_spec(tmp_path, reader):
    # found by the random mutations (seed 772430476): one hex digit of the 0.4 layout's pickled
    # tree spec changed makes a string's 8-byte length larger than any size, and the unpickler
    # raised OverflowError, which no reader of a damaged file expects
    data = bytearray((FIXTURES / "ckpt_legacy_0_4.h5").read_bytes())
    data[2255] = 100
    path = tmp_path / "mutated.h5"
    path.write_bytes(data)
    assert reader.read(path) == {"refused": (
        f"{path} is not a readable checkpoint: its tree spec cannot be unpickled "
        "(UnpicklingError: OverflowError: BINUNICODE exceeds system's maximum size of "
        f"{sys.maxsize} bytes).")}


def test_a_legacy_tensor_whose_byte_order_flipped_loads_instead_of_raising(tmp_path, reader):
    # found by the random mutations (seed 513079073, draw 289): one byte of the 0.4 layout's
    # datatype message made a float tensor big-endian, and mapping its dtype to torch raised
    # ValueError ("byte order different from the native byte order")
    data = bytearray((FIXTURES / "ckpt_legacy_0_4.h5").read_bytes())
    for pos, value in [(1137, 91), (9767, 128), (11649, 67), (307, 134)]:
        data[pos] = value
    path = tmp_path / "mutated.h5"
    path.write_bytes(data)
    assert next(iter(reader.read(path))) in ("loaded", "refused")


def _rewrite_big_endian(path: Path) -> int:
    """Every multi-byte number dataset of ``path`` stored again big-endian, attributes kept (HDF5
    converts on read; a machine of the other byte order writes them so); how many."""
    names = []
    with h5py.File(path, "r+") as f:
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset)
                     and o.shape is not None and o.dtype.kind in "iuf" and o.dtype.itemsize > 1
                     else None)
        for name in names:
            values, attrs = f[name][...], dict(f[name].attrs)
            del f[name]
            rewritten = f.create_dataset(name, data=values.astype(values.dtype.newbyteorder(">")))
            rewritten.attrs.update(attrs)
    return len(names)


@pytest.mark.parametrize("source", ["cstream unsealed", "real ckpt_legacy_0_4"])
def test_numbers_stored_big_endian_load_as_the_same_values(tmp_path, source):
    path = tmp_path / "ckpt.h5"
    if source == "cstream unsealed":
        write_unsealed(ORIGINAL, path)
    else:
        path.write_bytes((FIXTURES / "ckpt_legacy_0_4.h5").read_bytes())
    before = to_eager(cstream.load(path))
    # rewritten as a new file: tensors of an uncompressed file are views of the file mapped into
    # memory (as torch.load(mmap=True)'s), which a change of the same file in place would change
    rewritten = tmp_path / "big_endian.h5"
    rewritten.write_bytes(path.read_bytes())
    assert _rewrite_big_endian(rewritten) >= 2
    assert same(to_eager(cstream.load(rewritten)), before)


def test_every_single_byte_change_outside_the_values_of_an_unsealed_file_loads_or_is_refused(
        tmp_path, bases, reader):
    """Without the seal only HDF5's own checks and cstream's heap walk stand between a damaged byte
    and HDF5; every 9th byte of the metadata of cstream's unsealed file, flipped."""
    base = next(b for b in bases if b.name == "cstream unsealed")
    outcomes = {"loaded": 0, "refused": 0}
    for start, end in base.metadata:
        for pos in range(start, end, 9):
            data = bytearray(base.data)
            data[pos] ^= 0xA5
            path = tmp_path / f"flipped{pos}.h5"
            path.write_bytes(bytes(data))
            answer = reader.read(path)
            assert "raised" not in answer, (pos, answer)
            outcomes[next(iter(answer))] += 1
            path.unlink()
    assert outcomes["refused"] > 0, outcomes


def test_every_prefix_of_the_header_is_refused_as_truncated(tmp_path):
    cstream.save({"w": torch.ones(2)}, tmp_path / "f.h5")
    data = (tmp_path / "f.h5").read_bytes()
    for n in [*range(1, 64), *range(500, 530)]:
        (tmp_path / "cut.h5").write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="it is truncated: it has "):
            cstream.load(tmp_path / "cut.h5")


def test_a_file_with_a_damaged_global_heap_is_refused_not_read_for_ever(reader):
    """A mutation the fuzz test found in a file cstream wrote before it sealed its files: the free
    space of the second global heap collection claims 40 bytes, so the walk meets an object of size
    0, where HDF5's reader loops for ever. Read in the bounded child, so a regression fails."""
    path = REPO / "tests" / "data" / "corrupt_global_heap.h5"
    assert reader.read(path) == {"refused": (
        f"{path} is not a readable checkpoint: the global heap collection at byte 10240 is "
        "damaged: its object at byte 10752 has size 0; HDF5 would loop for ever or read past it. "
        f"Load an earlier checkpoint instead: `cstream ckpt inspect {path.parent}` lists the "
        "checkpoints there and which of them are intact.")}
