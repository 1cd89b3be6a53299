"""Reads every piece of an HDF5 file's structure that a checkpoint load reads, in a child process.

:func:`cstream.checkpoint.guard.probe` runs this file as ``python -I _h5_probe.py MEMORY_BYTES`` (it
imports only h5py and the standard library, and takes at most that much memory) and keeps it
running: for each line it reads (a file's path, as a
JSON string) it opens that file, reads every attribute of every object, and for every dataset its
type, shape, filters and the index of its chunks, and answers one line: ``"ok"``, or HDF5's error
(JSON strings). A damaged file that makes HDF5 loop or crash does so here, where the parent bounds
it and reports it, not in the caller's process. The same bytes read by the same HDF5 take the same
path, so what passes here is safe to read there.
"""

import json
import sys


def _walk(path: str) -> None:
    import h5py

    def attributes(obj) -> None:
        for name in obj.attrs:
            obj.attrs[name]

    def visit(_, obj) -> None:
        attributes(obj)
        if isinstance(obj, h5py.Dataset):
            obj.dtype, obj.shape
            plist = obj.id.get_create_plist()
            for i in range(plist.get_nfilters()):
                plist.get_filter(i)
            if obj.chunks and hasattr(obj.id, "chunk_iter"):  # one walk of the chunk index
                obj.id.chunk_iter(lambda info: None)
            elif obj.chunks:  # HDF5 before 1.14: each lookup walks the index from its start
                for i in range(obj.id.get_num_chunks()):
                    obj.id.get_chunk_info(i)

    with h5py.File(path, "r") as f:
        attributes(f)
        f.visititems(visit)


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when its parent ends, so a probe stuck in HDF5
    does not outlive a caller that was killed before it could stop the probe."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # a C library without prctl: the parent's kill suffices
            pass


def _limit_memory(nbytes: int) -> None:
    """A damaged dataspace can claim billions of elements; h5py would take that much memory to
    read the attribute. Here the allocation fails (MemoryError, a refused file) instead."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    except (ImportError, ValueError, OSError):  # no such limit on this system
        pass


def main(argv: list[str]) -> int:
    _die_with_parent()
    _limit_memory(int(argv[1]))
    for line in sys.stdin:
        try:
            _walk(json.loads(line))
            answer = "ok"
        except Exception as e:  # HDF5's refusal of a damaged file: the parent words it
            answer = " ".join(f"{type(e).__name__}: {e}".split())
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
