"""The input side's tests: the streams they open, the readers that take their batches, the
single-process sequence they compare with, and the Ray actors they count."""

from __future__ import annotations

import threading

import pytest
import torch

from workers.dataloader import DataLoader
from workers.flow import FlowPolicy
from workers.resume import Source
from workers.stream import configured_stream


class SampleIds(torch.utils.data.Dataset):
    """``n`` samples whose values are their ids, ``first`` onward: a batch shows which
    samples it holds."""

    def __init__(self, n: int, first: int = 1000):
        self.ids = torch.arange(first, first + n)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]


def open_streams(cfg, prefix, loader, resume=None, assigned_batches_per_worker=2, **kwargs):
    """One stream per CS-X of ``cfg``, its actors named ``PREFIX-csx<c>-w<w>``; replies carry at
    most ``batches_per_fetch`` batches whatever their size, a worker holds
    ``assigned_batches_per_worker`` numbers under dynamic assignment, and each CS-X resumes
    from its own states of ``resume`` (worker states, or None)."""
    policy = FlowPolicy.from_config(cfg, small_reply_batches=1,
                                    assigned_batches_per_worker=assigned_batches_per_worker)
    return [configured_stream(
        loader, cfg, c, name_prefix=prefix, policy=policy,
        resume_states=None if resume is None else [st for st in resume if st.wse_id == c],
        **kwargs)
        for c in range(cfg.num_csx)]


def close_all(streams):
    for s in streams:
        s.close()


READ_TIMEOUT_S = 300.0  # far beyond what a loaded machine needs; a deadlock never ends


def read_steps(streams, steps, ids=lambda batch: batch.tolist()):
    """The wafer's view of ``steps`` steps: each step, every CS-X's part (``ids(batch)``, a
    list) in CS-X order, joined; and the local worker each part came from. Read in a thread
    and waited for at most READ_TIMEOUT_S: a stream that waits forever fails the test."""
    out, workers, error = [], [], []

    def read():
        try:
            for _ in range(steps):
                parts = [s.next() for s in streams]
                out.append([i for batch, _ in parts for i in ids(batch)])
                workers.append([info.local_worker_id for _, info in parts])
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            error.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(READ_TIMEOUT_S)
    if reader.is_alive():
        pytest.fail(f"the streams delivered {len(out)} of {steps} steps in {READ_TIMEOUT_S} s "
                    "and are still waiting")
    if error:
        raise error[0]
    return out, workers


def client_sequence(input_fn, steps, ids=lambda batch: batch.tolist(), **kwargs):
    """The global batches one process streams from ``input_fn(**kwargs)`` (the CPU backend,
    worker 0 of 1), epoch after epoch: what the wafer must see."""
    loader = DataLoader(input_fn, **kwargs)
    source = Source(loader, loader.build())
    return [ids(next(source)) for _ in range(steps)]


def cstream_actors(ray) -> list[str]:
    """The names of the Ray actors cstream started (input workers, the wafer driver) that are
    alive now, in every namespace."""
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith("cstream"))
