"""Checks a checkpoint file before HDF5 reads any of it, so a damaged file is refused, never read.

HDF5 trusts the bytes it reads: one damaged byte in a global heap collection (where the variable
length strings of attributes live) can send its reader into a loop that never returns, and no
Python-side timeout can stop it. So every file is checked here first:

* **cstream's own files are sealed.** :func:`cstream.save` writes the HDF5 file with a 512-byte
  user block (HDF5 skips it; h5py and the real ``cerebras.pytorch`` read the file as usual) and,
  once HDF5 has closed the file, :func:`seal` fills the block: :data:`TAG`, the header's version,
  the block's size, the file's length, the CRC-32 of every byte after the block, and last the
  CRC-32 of the block itself. :func:`check` refuses a sealed file whose block, length or contents
  do not match, before HDF5 opens it: a flipped or truncated file is refused in the time it takes
  to read it once (CRC-32 runs at several GB/s).
* **Other HDF5 files** (the real package's, cstream's before it sealed its files) carry no checksum
  of their own. For them :func:`check` first finds every global heap collection (signature
  ``GCOL``) and walks its objects the way HDF5's reader does (``H5HG__cache_heap_deserialize``): a
  collection whose walk would not move forward (an object of size 0: HDF5 loops for ever) or would
  step past the collection's end is refused at once. In files of the newer format (superblock
  version 2 or 3, as cstream writes) HDF5 checksums every other structure it reads (superblock,
  object headers, B-trees, fractal heaps) and refuses a damaged one itself. Files of the older
  format (superblock 0 or 1, as the real package writes) have no such checksums, and a damaged
  object header can crash HDF5; for them :func:`probe` has a child process
  (:mod:`cstream.checkpoint._h5_probe`) read every attribute, type, shape and chunk index of the file, the
  structure a load reads. A child that crashes, fails or runs past :data:`PROBE_TIMEOUT_S` makes
  the file refused; one that passes read the same bytes with the same HDF5 the caller then uses.
  The child is started once (~0.3 s: it imports h5py) and kept for later files.
"""

from __future__ import annotations

import atexit
import json
import mmap
import os
import select
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

from isal import isal_zlib

from cstream.checkpoint.lazy import CheckpointError

TAG = b"\x89CSTREAM-H5-CHECKSUM\r\n\x1a\n"
USERBLOCK = 512
HEADER_VERSION = 1
# tag, header version, user block size, file length, CRC-32 of the bytes after the block
_HEADER = struct.Struct("<24sIIQI")
_NOTE = (b"\ncstream checkpoint: an HDF5 file follows this 512-byte user block, which holds the "
         b"file's length and the CRC-32 of everything after the block.\n")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # an HDF5 file's first bytes (or after a user block)
_WINDOW = 16 << 20  # a multiple of mmap.ALLOCATIONGRANULARITY
_GCOL_HEADER = 16  # "GCOL", version, 3 reserved bytes, collection size (8 bytes)
_OBJECT_HEADER = 16  # index (2), reference count (2), reserved (4), object size (8)
_WORD = 1 << 64  # HDF5 computes sizes in size_t: wrap as it does
PROBE_TIMEOUT_S = 120.0  # reading the structure of a file of 10,000 tensors takes a few seconds
PROBE_MEMORY_BYTES = 1 << 30  # the probe needs ~160 MB; a damaged size must not take the host's memory


def advice(path) -> str:
    """What to do with a damaged file: where the other checkpoints are and how to see them."""
    folder = os.path.dirname(os.fspath(path)) or "."
    return (f"Load an earlier checkpoint instead: `cstream ckpt inspect {folder}` lists the "
            "checkpoints there and which of them are intact.")


def damaged(path, what: str) -> CheckpointError:
    return CheckpointError(f"{path} is not a readable checkpoint: {what}. {advice(path)}")


def crc32(data, crc: int = 0) -> int:
    """``zlib.crc32`` (the same numbers), computed by ISA-L: ~4x faster here (3.3 against 0.8 GB/s
    on one core, 256 MiB), about the speed of copying the bytes once."""
    return isal_zlib.crc32(data, crc)


def _windows(f, start: int, length: int, overlap: int = 0):
    """The bytes of the file ``f`` from ``start``, at most ``length`` of them, as read-only memory
    maps of :data:`_WINDOW` bytes each (and ``overlap`` bytes more where the file has them), with
    the offset of each: the file is read from the page cache without a copy, and at most one window
    is resident at a time (a map of the whole file would count all of it in the process's memory)."""
    size = os.fstat(f.fileno()).st_size
    end = min(size, start + length)
    at = start - start % mmap.ALLOCATIONGRANULARITY
    while at < end:
        n = min(_WINDOW + overlap, size - at)
        with mmap.mmap(f.fileno(), n, offset=at, access=mmap.ACCESS_READ) as window:
            yield at, window
        at += _WINDOW


def _crc32(f, start: int, length: int) -> int:
    """CRC-32 of (at most) ``length`` bytes of ``f`` from ``start``."""
    crc = 0
    end = start + length
    for at, window in _windows(f, start, length):
        with memoryview(window) as view:
            crc = crc32(view[max(0, start - at): max(0, min(len(window), _WINDOW, end - at))], crc)
    return crc


def seal(path) -> None:
    """Fill the user block of the file HDF5 just closed at ``path`` (created with
    ``userblock_size=USERBLOCK``): its length and checksum, and the checksum of the block."""
    with open(path, "r+b") as f:
        length = os.fstat(f.fileno()).st_size
        if f.read(USERBLOCK) != bytes(USERBLOCK) or f.read(8) != HDF5_SIGNATURE:
            raise RuntimeError(f"{path} has no empty {USERBLOCK}-byte user block before its HDF5 data")
        crc = _crc32(f, USERBLOCK, length - USERBLOCK)
        block = bytearray(USERBLOCK)
        _HEADER.pack_into(block, 0, TAG, HEADER_VERSION, USERBLOCK, length, crc)
        block[_HEADER.size:_HEADER.size + len(_NOTE)] = _NOTE
        struct.pack_into("<I", block, USERBLOCK - 4, zlib.crc32(block[: USERBLOCK - 4]))
        f.seek(0)
        f.write(block)


def is_sealed(head: bytes) -> bool:
    """Whether a file starting with ``head`` claims to be sealed (its first bytes are :data:`TAG`)."""
    return head.startswith(TAG)


def check(path: str, head: bytes) -> None:
    """Refuse the HDF5 file at ``path`` (whose first bytes are ``head``) if HDF5 must not read it."""
    size = os.path.getsize(path)
    if is_sealed(head):
        _check_sealed(path, size)
    elif head.startswith(HDF5_SIGNATURE):
        old_format = len(head) <= 8 or head[8] < 2  # superblock 0 or 1: no checksums on structures
        if old_format:
            _PROBER.start()  # its start (importing h5py) overlaps the heap scan
        _check_global_heaps(path, size)
        if old_format:
            probe(path)
    else:  # the HDF5 data after a user block, but not cstream's header before it
        raise damaged(path, f"its first {USERBLOCK} bytes, the header cstream.save writes, are "
                            f"damaged (they do not start with cstream's tag {TAG!r})")


def _check_sealed(path: str, size: int) -> None:
    with open(path, "rb") as f:
        block = f.read(USERBLOCK)
        if len(block) < USERBLOCK:
            raise damaged(path, f"it is truncated: it has {size} bytes, fewer than its "
                                f"{USERBLOCK}-byte header")
        if zlib.crc32(block[: USERBLOCK - 4]) != struct.unpack_from("<I", block, USERBLOCK - 4)[0]:
            raise damaged(path, f"its header (the first {USERBLOCK} bytes, which hold the file's "
                                "length and checksum) is damaged: it does not match its own CRC-32")
        _, version, userblock, length, crc = _HEADER.unpack_from(block)
        if version != HEADER_VERSION or userblock != USERBLOCK:
            raise CheckpointError(
                f"{path} is not a readable checkpoint: its header has version {version} and a "
                f"{userblock}-byte user block; this cstream reads version {HEADER_VERSION} with "
                f"{USERBLOCK} bytes. Load it with the cstream release that wrote it.")
        if size < length:
            raise damaged(path, f"it is truncated: it has {size} bytes, its header records the "
                                f"{length} bytes written")
        if size > length:
            raise damaged(path, f"it has {size} bytes, {size - length} more than the {length} "
                                "bytes its header records (something was appended to it)")
        got = _crc32(f, USERBLOCK, length - USERBLOCK)
    if got != crc:
        raise damaged(path, f"its contents do not match the checksum in its header (CRC-32 "
                            f"{got:08x}, written {crc:08x}): the file was damaged after it was "
                            "written")


def _signatures(f, signature: bytes):
    """Every offset in the file ``f`` where ``signature`` starts, in order (``mmap.find`` over the
    file's windows, each overlapping the next by the signature's length less one)."""
    for at, window in _windows(f, 0, os.fstat(f.fileno()).st_size, len(signature) - 1):
        i = window.find(signature)
        while i != -1 and i < _WINDOW:
            yield at + i
            i = window.find(signature, i + 1)


def _check_global_heaps(path: str, size: int) -> None:
    if size == 0:
        return
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for at in _signatures(f, b"GCOL"):
            problem = _global_heap_problem(data, at, size)
            if problem:
                raise damaged(path, f"the global heap collection at byte {at} is damaged: "
                                    f"{problem}; HDF5 would loop for ever or read past it")


def _global_heap_problem(data, at: int, size: int) -> str | None:
    """Why HDF5's walk of the collection at ``at`` would not end inside it; None if it would.

    Bytes that only look like a collection (``GCOL`` inside other data) are judged the same way:
    a reader led there by a damaged address would walk them."""
    if at + _GCOL_HEADER > size or data[at + 4] != 1:
        return None  # HDF5 refuses such a collection itself (cut off, or an unknown version)
    (length,) = struct.unpack_from("<Q", data, at + 8)
    end = at + length
    if end > size:
        return f"it claims {length} bytes, past the end of the file ({size} bytes)"
    p = at + _GCOL_HEADER
    while p < end:
        if p + _OBJECT_HEADER > end:
            return None  # the rest is free space, too small for an object header
        index, _, _, object_size = struct.unpack_from("<HHIQ", data, p)
        if index > 0:
            step = (_OBJECT_HEADER + ((object_size + 7) % _WORD & ~7)) % _WORD
        else:
            step = object_size
        if step == 0:
            return f"its object at byte {p} has size 0"
        if p + step > end:
            return (f"its object at byte {p} ({object_size} bytes) runs past the collection's "
                    f"end at byte {end}")
        p += step
    return None


class _Prober:
    """The child process running :mod:`cstream.checkpoint._h5_probe`, started on first use and kept (importing
    h5py costs ~0.3 s); killed and started afresh after a probe it did not answer in time."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.owner = 0
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None or self.owner != os.getpid():
            script = Path(__file__).with_name("_h5_probe.py")
            self.proc = subprocess.Popen([sys.executable, "-I", str(script), str(PROBE_MEMORY_BYTES)],
                                         stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.owner = os.getpid()
        return self.proc

    def start(self) -> None:
        """Starts the child now if it is not running, so that it is ready by the first probe."""
        with self.lock:
            self._start()

    def stop(self) -> None:
        if self.proc is not None and self.owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def ask(self, path: str, timeout_s: float) -> tuple[str | None, int | None]:
        """HDF5's answer for ``path`` ("ok" or its error), or (None, exit status) if the child
        ended, or (None, None) if it gave no answer within ``timeout_s`` (it is then killed)."""
        with self.lock:
            proc = self._start()
            try:
                proc.stdin.write(json.dumps(os.path.abspath(path)) + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # it died: readline below sees its end
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            if not ready:
                self.stop()
                return None, None
            line = proc.stdout.readline()
            if not line:
                status = proc.wait()
                self.proc = None
                return None, status
            return json.loads(line), None


_PROBER = _Prober()
atexit.register(_PROBER.stop)


def probe(path: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse the file if HDF5 cannot read its structure in a child process within ``timeout_s``."""
    answer, status = _PROBER.ask(path, timeout_s)
    if answer == "ok":
        return
    if answer is None and status is None:
        raise damaged(path, f"HDF5 did not finish reading its structure within {timeout_s:.0f} s "
                            "(a damaged file can keep HDF5 busy for ever)")
    if answer is None and status < 0:
        raise damaged(path, f"HDF5 crashed reading its structure (signal {-status}), which only a "
                            "damaged file does")
    if answer is None:
        raise CheckpointError(
            f"{path} could not be checked: the process that reads a checkpoint's structure before "
            f"cstream does ({sys.executable} -I {Path(__file__).with_name('_h5_probe.py')} "
            f"{PROBE_MEMORY_BYTES}) exited "
            f"with status {status}. Run that command to see why (it needs h5py).")
    raise damaged(path, f"HDF5 cannot read its structure ({answer})")
