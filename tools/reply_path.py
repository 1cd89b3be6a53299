"""Follow replies from the input workers to the wafer and list every call that goes back into
a file already on the call stack (a file the reply left, entered again).

Runs one CS-X's stream with round-robin and with dynamic assignment, each under an
:class:`~executor.wafer.feed.InputFeed` as the wafer driver runs it, with a profiler in every
thread (the feeders and the coordinator's pump included) for 20 steps. Prints, per
assignment, every call from one file of ``workers/`` or ``executor/`` into another (marking
pairs of files that call each other) and each call back into a file already on the stack
(with the two functions), and exits 1 if there is one.

    PYTHONPATH=. python tools/reply_path.py
"""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("workers", "executor")


def ids_fn(n=256, batch_size=4, sleep_s=0.01):
    """Global batches of sample ids; each sample takes ``sleep_s``, so that replies arrive
    while the steps are followed."""
    import time

    from torch.utils.data import BatchSampler, SequentialSampler

    from workers.sharding import ShardedSampler

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            time.sleep(sleep_s)
            return torch.tensor(i)

    batches = BatchSampler(SequentialSampler(range(n)), batch_size=batch_size, drop_last=True)
    return torch.utils.data.DataLoader(Slow(), batch_sampler=ShardedSampler(batches))


class Tracer:
    """Per thread, the stack of repository files of the frames being run; a call into a file
    that is on the stack below another file is a call back."""

    def __init__(self):
        self.stacks: dict[int, list] = collections.defaultdict(list)
        self.backs: collections.Counter = collections.Counter()
        self.edges: collections.Counter = collections.Counter()  # (caller file, callee file)
        self.on = False

    def __call__(self, frame, event, arg):
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        rel = None
        if path.startswith(str(REPO)):
            rel = str(Path(path).relative_to(REPO))
            if not rel.startswith(PACKAGES):
                rel = None
        stack = self.stacks[threading.get_ident()]
        if event == "call":
            if rel is not None and self.on:
                files = [f for f, _ in stack]
                if files and files[-1] is not None and files[-1] != rel:
                    self.edges[(files[-1], rel)] += 1
                if files and files[-1] != rel and rel in files:
                    caller = stack[-1]
                    self.backs[(caller[0], caller[1], rel, frame.f_code.co_name)] += 1
            stack.append((rel if rel is not None else (stack[-1][0] if stack else None),
                          frame.f_code.co_name))
        elif stack:
            stack.pop()


def follow(plan_name: str, steps: int = 20) -> Tracer:
    from executor.wafer.feed import InputFeed
    from workers.config import CSConfig
    from workers.dataloader import DataLoader
    from workers.flow import FlowPolicy
    from workers.stream import configured_stream

    cfg = CSConfig(num_workers_per_csx=2, input_assignment=plan_name)
    policy = FlowPolicy.from_config(cfg)
    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        stream = configured_stream(DataLoader(ids_fn), cfg, 0, policy=policy,
                                   name_prefix=f"path-{plan_name}")
        feed = InputFeed([stream], policy, cfg)
        feed.start(steps + 2, set())
        feed.take(timeout=30)  # the first step: start-up calls are not the path of a reply
        tracer.on = True
        for _ in range(steps):
            got = feed.take(timeout=30)
            assert got is not None, "no step input within 30 s"
        tracer.on = False
        feed.close()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return tracer


def main() -> int:
    from executor.ray_session import ensure_ray

    ensure_ray()
    found = 0
    for plan_name in ("static", "dynamic"):
        tracer = follow(plan_name)
        print(f"{plan_name}: calls from one file into another (caller -> callee: calls)")
        for (a, b), n in sorted(tracer.edges.items()):
            back = " (and back the other way)" if (b, a) in tracer.edges else ""
            print(f"  {a} -> {b}: {n}{back}")
        for (caller_file, caller, callee_file, callee), n in sorted(tracer.backs.items()):
            print(f"  call back: {caller_file}:{caller} -> {callee_file}:{callee} ({n}x)")
        print(f"  calls back into a file already on the stack: {sum(tracer.backs.values())}")
        found += sum(tracer.backs.values())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
