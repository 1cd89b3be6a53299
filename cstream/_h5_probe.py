"""Reads every piece of an HDF5 file's structure that a checkpoint load reads, in a child process.

Run as ``python -I _h5_probe.py FILE`` by :func:`cstream.checkpoint_guard.probe` (it imports only
h5py and the standard library, so it starts fast): it opens the file, reads every attribute of
every object, and for every dataset its type, shape, filters and the index of its chunks; it
prints ``ok`` and exits 0, or prints HDF5's error and exits 1. A damaged file that makes HDF5 loop
or crash does so here, where the parent can bound it and report it, not in the caller's process.
The same bytes read by the same HDF5 take the same path, so what passes here is safe to read there.
"""

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
            if obj.chunks:
                for i in range(obj.id.get_num_chunks()):
                    obj.id.get_chunk_info(i)

    with h5py.File(path, "r") as f:
        attributes(f)
        f.visititems(visit)


def main(argv: list[str]) -> int:
    try:
        _walk(argv[1])
    except Exception as e:  # HDF5's refusal of a damaged file: the parent words it
        print(" ".join(f"{type(e).__name__}: {e}".split()))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
