"""The one thread of the driver that runs the wafer's torch work.

On a CPU, torch's parallel ops run on OpenMP (GNU libgomp), which keeps one pool of worker
threads per thread that ever ran a parallel op, for that thread's life. When the pools' threads
together outnumber the CPUs, libgomp stops spinning between parallel regions and puts its
threads to sleep after each one: every op of a step then waits for its threads to wake. On 2
CPUs, the compiled step of the small transformer of ``benchmarks/train_throughput.py`` took
10.1-10.4 ms on the thread that made the first pool and 14.8-16.2 ms on a second thread, and
an elementwise add of 1M floats 0.05 against 0.11 ms.

So every torch computation of the driver that can be large -- storing the state it is sent,
compiling and checking the program, the steps, reading the state back -- runs on this one
thread, which lives as long as the driver. Calls of the driver made while a run's loop holds
the thread (the client's collects, snapshots) only move small tensors or references.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable

POLL_S = 1.0
"""How often a caller waiting for the thread checks that it is still alive."""


class ComputeThreadDied(RuntimeError):
    """The compute thread ended while a caller waited for its work."""


class ComputeThread:
    def __init__(self, name: str = "wafer"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to whoever waits for the future
                future.set_exception(e)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the thread after the work queued before it; its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def on_this_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], Any], what: str) -> Any:
        """Run ``fn`` on the thread and return its result (or raise its error), waiting as long
        as the thread lives; ``what``: the work, named in the error if the thread dies. Called
        on the thread itself, ``fn`` runs at once."""
        if self.on_this_thread():
            return fn()
        future = self.submit(fn)
        while True:
            try:
                return future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():
                    raise ComputeThreadDied(
                        f"the wafer's compute thread ended before it finished {what}.") from None

    def close(self) -> None:
        """End the thread once the work queued before this call is done."""
        self._jobs.put(None)
