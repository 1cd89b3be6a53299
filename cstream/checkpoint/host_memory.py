"""Memory for the values a checkpoint load reads."""

from __future__ import annotations

import math
import mmap
import sys

import numpy as np
import torch

MAPPED_FROM = 1 << 20
"""Arrays of at least this many bytes get memory of their own, mapped from the kernel and
populated in one call; smaller ones come from torch's allocator."""

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14 and later


def host_array(shape, dtype) -> np.ndarray:
    """An uninitialised array for a tensor's values.

    A load writes gigabytes into memory the process never touched, and taking that memory from
    the kernel page by page, one fault each, costs more than decoding the values into it: on a
    2-vCPU KVM machine, 2 GiB took 1.0-5.6 s to touch page by page against 0.9 s populated in
    one ``madvise(MADV_POPULATE_WRITE)``. So a large array gets an anonymous private mapping of
    its own, populated at once (where the kernel has no such call, its pages are faulted in as
    they are written, as before), freed with the last tensor that uses it. Transparent huge
    pages are not asked for: where the kernel finds them by compacting memory when first touched
    (the Linux default, ``defrag=madvise``), a 2 GiB load waited 10-13 s for them on that machine.
    """
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes >= MAPPED_FROM and sys.platform == "linux":
        memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            memory.madvise(MADV_POPULATE_WRITE)
        except OSError:  # a kernel before 5.14: the pages are faulted in as they are written
            pass
        return np.frombuffer(memory, dtype, count).reshape(shape)
    raw = torch.empty(nbytes, dtype=torch.uint8).numpy()
    return raw.view(dtype).reshape(shape)
