"""The heap of a process where cstream runs steps: glibc's ``malloc`` told to keep the memory a
step frees for the next step.

A step allocates the same buffers every time it runs (activations, gradients, the optimizer's
temporaries) and frees them when it ends. By default glibc gives a block over 128 KiB pages of
its own (``mmap``) and hands the free top of a thread's heap back to the kernel, so every step
faults its buffers' pages in again and the kernel zeroes them. Measured with ``perf`` on the
MLP 784-512-512-10 (batch 64, Adam) on the Ray driver: the compute threads were in the kernel
(page faults, unmapping) for 11.8% of the machine's samples, 1.9% with the settings below.

:func:`keep_freed_memory` serves blocks up to 32 MiB (the largest threshold glibc accepts)
from the heap and never trims it. The process's resident memory then stays at its peak instead
of falling between steps. It is called once in the Ray driver actor's process, which is
cstream's own, and by :func:`keep_freed_memory_here` wherever cstream runs the step in the
user's process: the CPU and GPU backends and the in-process wafer. ``benchmarks/heap.py``
measured the MLP 784-512-512-10 (steps/s, medians of 3) on the CPU backend at 225 with the
default heap and 300 with this one, in-process at 333 and 416.
``CSTREAM_KEEP_FREED_MEMORY=0`` in the environment leaves the user's process as it is.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
"""Blocks up to this size come from the heap: the largest threshold glibc accepts (half the
64 MiB of a thread's heap on a 64-bit machine)."""
TRIM_THRESHOLD_BYTES = (1 << 31) - 1
"""Free memory at the top of a heap kept up to this size (a C int's largest): never trimmed."""


def keep_freed_memory() -> str:
    """Set this process's ``malloc`` to reuse what a step frees (see the module's text); what
    was done, for the run summary: ``"kept"``, or why not (not glibc, or ``mallopt`` said no)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"unchanged: {platform.system()} without glibc"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "unchanged: no mallopt in this process"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1 or \
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) != 1:
        return "unchanged: mallopt refused the thresholds"
    return "kept"


OPT_OUT = "CSTREAM_KEEP_FREED_MEMORY"
"""Set to ``0`` to leave the heap of the user's process as it is (:func:`keep_freed_memory_here`)."""


def keep_freed_memory_here() -> str:
    """:func:`keep_freed_memory` for a step run in the user's process, unless the environment
    says ``CSTREAM_KEEP_FREED_MEMORY=0``; what was done, for the run summary."""
    if os.environ.get(OPT_OUT, "").strip() == "0":
        return f"unchanged: {OPT_OUT}=0"
    return keep_freed_memory()
