"""Autoscaled runs on Ray: a paced wafer that needs 3 workers of an I/O-like input gets them,
gives them back when the input gets cheaper, and sees exactly a fixed-count run's samples;
checkpoints taken at an autoscaled count resume exactly."""

from __future__ import annotations

import functools
import re
import json
import time

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, RandomSampler

import cstream as cstorch
from helpers.runs import record_run

SAMPLES = 4          # per batch
BATCH_WAIT_S = 0.06  # an I/O-like input: each batch waits 60 ms (15 ms a sample)
WAFER_STEP_S = 0.024  # the wafer takes 41.7 batches/s: 2 workers (~33/s) starve it, 3 do not
AUTO = cstorch.utils.Autoscale(min_workers_per_csx=1, max_workers_per_csx=6, window_steps=20,
                               cooldown_steps=20)


class SlowReads(Dataset):
    """Sample ``i`` is ``i``; reading one waits ``wait_s`` (``cheap_s`` from sample
    ``cheap_from`` of the shuffled order's batches on: the input gets cheaper mid-run)."""

    def __init__(self, n, wait_s, cheap_from=None, cheap_s=0.0):
        self.n, self.wait_s, self.cheap_from, self.cheap_s = n, wait_s, cheap_from, cheap_s
        self.read = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        cheap = self.cheap_from is not None and self.read >= self.cheap_from
        self.read += 1
        time.sleep(self.cheap_s if cheap else self.wait_s)
        return (torch.tensor([float(i)]),)


def io_input_fn(n=4000, wait_s=BATCH_WAIT_S / SAMPLES, cheap_from_batch=None, cheap_s=0.0):
    """A seeded shuffle of ``n`` samples in global batches (ShardedSampler), each read
    waiting; past global batch ``cheap_from_batch`` of a worker's reads, cheaper. A batch's
    cost then depends on how many batches the worker read, not on which: the ids the wafer
    sees do not."""
    data = SlowReads(n, wait_s, None if cheap_from_batch is None else cheap_from_batch,
                     cheap_s)
    order = RandomSampler(data, generator=torch.Generator().manual_seed(7))
    batches = BatchSampler(order, batch_size=SAMPLES, drop_last=True)
    return torch.utils.data.DataLoader(data, batch_sampler=cstorch.utils.data.ShardedSampler(
        batches))


def run(steps, workers, input_kwargs=None, resume=None, checkpoint_steps=None,
        wafer_s=WAFER_STEP_S, autoscale=AUTO):
    """The sample ids the wafer saw, the dataloader states at checkpoint steps, the profile."""
    cfg = cstorch.utils.CSConfig(num_workers_per_csx=workers, wafer_seconds_per_step=wafer_s,
                                 autoscale=autoscale if workers == "auto" else None)
    run = record_run(
        "CSX", functools.partial(io_input_fn, **(input_kwargs or {})), steps, cfg,
        resume=resume, checkpoint_steps=checkpoint_steps)
    seen, states, executor = run.seen, run.states, run.executor
    return seen, states, json.loads((executor.run_dir / "profile.json").read_text())


def counts_over_steps(profile) -> list[int]:
    return [r["num_workers"][0] for r in profile["steps"]]


@pytest.mark.timeout(900)  # two 700-step runs and 10-20 s worker start-ups; a hang still fails
def test_from_one_worker_the_run_finds_three_keeps_the_wafer_busy_and_the_sequence_exact(
        ray_session):
    # 700 steps: a new worker's process takes 10-20 s to start on a loaded 2-core machine
    auto, _, profile = run(700, "auto")
    fixed, _, _ = run(700, 3)
    assert auto == fixed  # exactly the fixed 3-worker run's samples, in its order
    assert len(auto) == 700 * SAMPLES and len(set(auto)) == len(auto)
    a = profile["report"]["autoscale"]["csx"][0]
    assert 2 <= a["workers"] <= 4, a  # 3 (+-1) settled, whatever the machine's noise
    assert a["phase"] == "settled", a
    assert a["busy_since_settled"] >= 0.95, a
    counts = counts_over_steps(profile)
    assert counts[0] == 1 and counts[-1] == a["workers"]
    decisions = profile["summary"]["autoscale"]["decisions"]
    assert decisions and all(d["action"] == "add" for d in decisions[:1])
    assert all(d["reason"] for d in decisions)


def test_cheaper_input_mid_run_retires_workers_and_the_sequence_stays_exact(ray_session):
    # from each worker's 60th batch on a read costs nothing: one worker then carries the wafer
    kwargs = {"cheap_from_batch": 60 * SAMPLES, "cheap_s": 0.0}
    auto, _, profile = run(500, "auto", kwargs)
    cpu_order = cpu_samples(500, kwargs)
    assert auto == cpu_order
    counts = counts_over_steps(profile)
    peak = max(counts)
    assert peak >= 2 and counts[-1] < peak, counts[::20]
    actions = [d["action"] for d in profile["summary"]["autoscale"]["decisions"]]
    assert "add" in actions and "retire" in actions


def cpu_samples(steps, input_kwargs):
    """The CPU backend's samples of the same loader (the oracle), the reads not waiting."""
    kwargs = {**input_kwargs, "wait_s": 0.0, "cheap_s": 0.0}
    return record_run("CPU", functools.partial(io_input_fn, **kwargs), steps).seen


@pytest.mark.parametrize("resumed_with", ["auto", 2])
def test_a_checkpoint_at_an_autoscaled_count_resumes_exactly(ray_session, resumed_with):
    full, states, profile = run(300, "auto", checkpoint_steps=150)
    saved = states[149]
    assert saved["num_workers_per_csx"] == len(saved["workers"]) >= 2  # it had grown
    assert saved["autoscale"]["format"] == "cstream.autoscale/1"
    tail, _, resumed = run(150, resumed_with, resume=saved)
    assert tail == full[150 * SAMPLES:]
    first = resumed["steps"][0].get("num_workers")
    if resumed_with == "auto":
        assert first == [saved["num_workers_per_csx"]]  # it continues where it was
    else:
        assert first is None and resumed["summary"].get("autoscale") is None


def own_list_input_fn():
    """Each worker's own list of batches: positions per worker, no global batch numbers."""
    info = cstorch.distributed.get_worker_info()
    return [torch.full((2, 1), float(10 * info.local_worker_id + i)) for i in range(50)]


def test_autoscaling_a_loader_that_cannot_be_re_formed_is_refused_at_start(ray_session):
    with pytest.raises(cstorch.AutoscaleError) as e:
        record_run("CSX", own_list_input_fn, 5,
                   cstorch.utils.CSConfig(num_workers_per_csx="auto"))
    msg = str(e.value)
    assert msg.startswith("CSConfig.num_workers_per_csx='auto': the loader own_list_input_fn "
                          "builds in CS-X 0's input workers cannot be re-formed exactly with "
                          "another worker count (")
    assert msg.endswith("), so with workers joining or leaving the wafer's sequence would "
                        "not stay a fixed-count run's. Do as that says, or give a fixed "
                        "num_workers_per_csx.")


def test_autoscaling_in_process_is_refused_with_the_reason():
    with pytest.raises(cstorch.AutoscaleError, match=r"this run streams its input in this process "
                                         r"\(in_process=True\), where the workers run one "
                                         r"after another"):
        record_run("CSX", io_input_fn, 5, cstorch.utils.CSConfig(num_workers_per_csx="auto"),
                   in_process=True)


def test_zero_workers_in_process_keeps_one_worker_and_says_why():
    # 0 is the Cerebras "chosen automatically" that Model Zoo programs pass: where the input
    # cannot change its workers the run is not refused but keeps min_workers_per_csx
    run = record_run(
        "CSX", functools.partial(io_input_fn, n=40, wait_s=0.0), 5,
        cstorch.utils.CSConfig(num_workers_per_csx=0), in_process=True)
    seen, executor = run.seen, run.executor
    fixed = record_run("CSX", functools.partial(io_input_fn, n=40, wait_s=0.0), 5,
                       cstorch.utils.CSConfig(num_workers_per_csx=1), in_process=True).seen
    assert seen == fixed and len(seen) == 5 * SAMPLES
    summary = json.loads((executor.run_dir / "profile.json").read_text())["summary"]
    assert "autoscale" not in summary
    assert summary["autoscale_not_possible"].startswith(
        "CSConfig.num_workers_per_csx='auto' finds the input workers while the run runs, and "
        "this run streams its input in this process (in_process=True)")


def test_zero_workers_with_a_loader_that_cannot_be_re_formed_runs_fixed(ray_session):
    run = record_run("CSX", own_list_input_fn, 5, cstorch.utils.CSConfig(num_workers_per_csx=None))
    seen, executor = run.seen, run.executor
    fixed = record_run("CSX", own_list_input_fn, 5,
                       cstorch.utils.CSConfig(num_workers_per_csx=1)).seen
    assert seen == fixed and len(seen) == 5  # one value a step
    summary = json.loads((executor.run_dir / "profile.json").read_text())["summary"]
    assert summary["autoscale_not_possible"].startswith(
        "CSConfig.num_workers_per_csx='auto': the loader own_list_input_fn builds in CS-X 0's "
        "input workers cannot be re-formed exactly")


def test_cstream_run_auto_prints_where_the_workers_settled(tmp_path):
    from helpers.cli import REPO, cstream

    done = cstream("run", REPO / "configs" / "digits_input_only.yaml", "--num-workers-per-csx",
                   "auto", "--steps", "60", "--no-progress", "--artifact-dir", tmp_path,
                   cwd=REPO, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "digits_input_only: 1 CS-X x auto (1-16, from 1) workers" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"input workers of CS-X 0: (settled at \d+ workers? per CS-X "
                        r"(after \d+ steps|from the start); wafer \d+\.\d% busy since step "
                        r"\d+|\d+ workers? per CS-X at the end \(.+)", last), last
