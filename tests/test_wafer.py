"""The wafer path: the loop's state machine driven by hand, outputs streamed back in batches,
the driver's threads, the compile cache and tiered compilation."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import cstream as cstorch
from executor.engine import compiler as compilers
from executor.report_text import summary_lines
from executor.wafer import program
from executor.wafer.feed import InputFeed
from executor.wafer.loop import Phase, RunPlan, WaferLoop
from executor.wafer.state import StateStore
from helpers.cli import child_env
from workers.config import CSConfig
from workers.dataloader import DataLoader
from workers.flow import FlowPolicy
from workers.local_stream import LocalInputStream

REPO = Path(__file__).resolve().parents[1]


# -- the loop, by hand ----------------------------------------------------------------------------
def _loop(input_fn, num_steps, lookahead=3, program=None):
    stream = LocalInputStream(DataLoader(input_fn), CSConfig(), 0)
    policy = FlowPolicy(lookahead_steps=lookahead, input_buffer_batches=2)
    feed = InputFeed([stream], policy, CSConfig())
    plan = RunPlan(num_steps=num_steps, checkpoint_steps=frozenset())
    feed.start(num_steps, plan.checkpoint_steps)
    loop = WaferLoop(StateStore(torch.device("cpu")), feed, program, [], plan, policy,
                     torch.device("cpu"))
    return loop, feed


def _until_not(loop, phase):
    """Step with blocking waits (each bounded) until the loop leaves ``phase``."""
    for _ in range(200):
        p = loop._step(block=True)
        if p is not phase:
            return p
    raise AssertionError(f"the loop stayed {phase}")


def test_the_loop_waits_for_input_runs_steps_and_stops_at_the_look_ahead():
    gate = threading.Event()

    def input_fn():
        for i in range(100):
            if i >= 2:
                gate.wait()
            yield torch.full((2,), float(i))

    def program(state, batch, step):
        return [batch[0].sum()]

    loop, feed = _loop(input_fn, num_steps=6, lookahead=3, program=program)
    try:
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.READY  # step 1 ran
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.READY  # step 2 ran
        assert loop.done == 1
        assert loop._step(block=False) is Phase.WAITING_FOR_INPUT  # batch 3 is held back
        gate.set()
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.READY
        assert loop.done == 2
        # steps 0..2 ran and none was acknowledged: the look-ahead (3) is used up
        assert loop._step(block=False) is Phase.WAITING_FOR_CLIENT
        assert sorted(loop.outputs) == [0, 1, 2]
        got = loop.collect(since=0, until=2, indices=[0], ack=0)
        # steps 1 and 2 (step 0 was acknowledged), output 0 of each, stacked
        assert (got.first, got.done) == (1, 2)
        assert [v.tolist() for v in got.values] == [[2.0, 4.0]]
        assert [s["step"] for s in got.stats] == [1, 2, 3]
        assert sorted(loop.outputs) == [1, 2]  # the acknowledged step's outputs are gone
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.READY
        assert loop._step(block=False) is Phase.WAITING_FOR_CLIENT
        assert len(loop.outputs) <= 3  # a hard bound
        loop.ack(5)  # the client is ahead of the wafer: steps 4 and 5 are acknowledged already
        assert loop.outputs == {}
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.READY
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.FINISHED
        assert loop.done == 5
        assert loop.outputs == {}  # so they keep no outputs: nothing would ever drop them
    finally:
        feed.close()


def test_the_loop_stops_when_asked_and_fails_with_the_input_error():
    def endless():
        while True:
            yield torch.zeros(2)

    loop, feed = _loop(endless, num_steps=10)
    loop.stop()
    assert loop._step(block=False) is Phase.STOPPED
    feed.close()

    def broken():
        yield torch.zeros(2)
        raise ValueError("row 7 is corrupt")

    loop, feed = _loop(broken, num_steps=10)
    try:
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.READY
        assert _until_not(loop, Phase.WAITING_FOR_INPUT) is Phase.FAILED
        with pytest.raises(Exception, match="row 7 is corrupt"):
            loop.raise_if_failed()
    finally:
        feed.close()


# -- runs -----------------------------------------------------------------------------------------
def _data(n=24, batch=4):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 3, (batch,), generator=g))
            for _ in range(n)]


def _train(kind, steps=12, on_closure=None, workers=1, **options):
    """The loop of Cerebras' porting guide (a step closure every step); AdamW; returns losses
    and the executor."""
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4096), torch.nn.Tanh(),
                                torch.nn.Linear(4096, 3))
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.step_closure
    def post(loss):
        losses.append(loss.item())
        if on_closure is not None:
            on_closure(len(losses) - 1)

    ex = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(_data), num_steps=steps,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=workers))
    for batch in ex:
        post(step(batch))
    return losses, ex


@pytest.mark.parametrize("thread", ["feeder-csx0", "wafer"])
@pytest.mark.parametrize("with_model", [True, False])
def test_a_ctrl_c_while_a_runs_thread_starts_reaches_the_user_as_keyboard_interrupt(
        thread, with_model, monkeypatch):
    """A Ctrl-C can land inside ``Thread.start()``; the run's clean-up then must not join a
    thread that never started (``RuntimeError: cannot join thread before it is started``)."""
    start = threading.Thread.start

    def interrupted_start(self):
        if self.name == thread:
            raise KeyboardInterrupt
        start(self)

    def run():
        if with_model:
            return _train("CSX", in_process=True, compiler="fx", steps=3)[0]
        cstorch.backend("CSX", in_process=True)  # a loop without a model: the wafer starts
        ex = cstorch.utils.data.DataExecutor(  # after the first step's body
            cstorch.utils.data.DataLoader(_data), num_steps=3)
        return [i for i, _ in enumerate(ex)]

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.undo()
    cstorch.current_backend().shutdown()
    assert len(run()) == 3  # the next run in the process works


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("n", [1, 2])
def test_in_process_csx_equals_the_cpu_backend_bit_for_bit_at_the_same_thread_count(
        n, threads, monkeypatch):
    monkeypatch.delenv("CSTREAM_KEEP_FREED_MEMORY", raising=False)
    torch.set_num_threads(n)
    cpu, cpu_ex = _train("CPU")
    cstorch.current_backend().shutdown()
    csx, ex = _train("CSX", in_process=True, compiler="fx", num_threads=n)
    assert csx == cpu
    assert ex.summary["num_threads"] == n
    # both run the step in this process, whose heap then keeps what a step frees
    kept = "kept" if GLIBC else f"unchanged: {platform.system()} without glibc"
    assert ex.summary["heap"] == cpu_ex.summary["heap"] == kept


def test_with_cstream_keep_freed_memory_0_a_step_in_this_process_leaves_its_heap_as_it_is(
        monkeypatch):
    monkeypatch.setenv("CSTREAM_KEEP_FREED_MEMORY", "0")
    _, cpu_ex = _train("CPU", steps=2)
    cstorch.current_backend().shutdown()
    _, csx_ex = _train("CSX", in_process=True, compiler="fx", steps=2)
    said = "unchanged: CSTREAM_KEEP_FREED_MEMORY=0"
    assert cpu_ex.summary["heap"] == csx_ex.summary["heap"] == said


def test_the_ray_driver_runs_with_its_threads_and_equals_the_cpu_backend_bit_for_bit(
        ray_session, threads):
    torch.set_num_threads(2)
    cpu, _ = _train("CPU")
    cstorch.current_backend().shutdown()
    csx, ex = _train("CSX", compiler="fx", num_threads=2)
    assert csx == cpu
    profile = json.loads((ex.run_dir / "profile.json").read_text())
    assert profile["summary"]["num_threads"] == 2
    assert profile["summary"]["heap"] == ("kept" if GLIBC else
                                          f"unchanged: {platform.system()} without glibc")
    startup = profile["summary"]["startup"]
    for part in ("ray_start_s", "driver_ready_s", "open_input_s", "trace_s", "compile_s",
                 "time_to_first_step_s"):
        assert startup[part] >= 0, part


GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

_STEPS_AND_FAULTS = textwrap.dedent("""
    import json, resource, sys, threading
    import torch
    from executor.wafer.heap import keep_freed_memory
    said = keep_freed_memory() if sys.argv[1] == "kept" else None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    out = {"said": said}
    def run():  # on a thread of its own, as the driver's compute thread
        for i in range(23):
            if i == 3:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        out["faults_per_step"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 20
    t = threading.Thread(target=run)
    t.start()
    t.join()
    print(json.dumps(out))
""")


@pytest.mark.skipif(not GLIBC, reason="the heap setting is glibc's mallopt")
def test_the_drivers_heap_keeps_what_a_step_frees_so_the_next_step_takes_no_page_faults():
    done = subprocess.run([sys.executable, "-c", _STEPS_AND_FAULTS, "kept"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    kept = json.loads(done.stdout.strip().splitlines()[-1])
    assert kept["said"] == "kept"
    # the step's buffers span ~1,100 pages (glibc's defaults fault them in every step: 1,162 a
    # step with glibc 2.36, the script run with "default"); kept, a step reuses the pages of
    # the one before
    assert kept["faults_per_step"] <= 50, kept


def test_outputs_stream_back_in_batches_so_closures_on_finished_steps_make_no_call():
    calls = []

    def on_closure(i):
        run = cstorch.current_executor().run
        if i == 0:
            run.driver.wait_done(7)  # the wafer is now 8 steps ahead
        calls.append(run.outputs.collect_calls)

    cpu, _ = _train("CPU", steps=16)
    cstorch.current_backend().shutdown()
    csx, ex = _train("CSX", in_process=True, compiler="fx", steps=16, lookahead=8,
                     on_closure=on_closure)
    assert csx == cpu
    # step 1's closure made the first collect; once the wafer is 8 steps ahead, one more
    # collect brings every step through 8: the closures of steps 2-8 make at most one call
    assert calls[0] == 1 and calls[7] <= 2
    assert ex.summary["collect_calls"] < 16


def test_compile_dir_is_resolved_on_the_client(tmp_path):
    backend = cstorch.backend("CSX", in_process=True, compile_dir="cc")
    assert backend.compile_dir == (tmp_path / "cc").resolve()


# -- the compile cache and tiered compilation -----------------------------------------------------
@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A compile cache holding the inductor artifact of ``_train``'s step (compiled once)."""
    cc = tmp_path_factory.mktemp("warm") / "cc"
    from executor import runtime

    runtime.reset()
    _train("CSX", in_process=True, compiler="inductor", compile_only=True, compile_dir=cc)
    runtime.reset()
    assert list(cc.glob("*/inductor")), "the inductor artifact was not written"
    return cc


def test_the_cache_key_holds_the_thread_count():
    from executor.engine.compiler import cache_key

    spec = [((4, 8), "torch.float32")]
    keys = {cache_key("graph", spec, "cpu", n) for n in (1, 2)}
    assert len(keys) == 2
    assert cache_key("graph", spec, "cpu", 2) == cache_key("graph", spec, "cpu", 2)
    assert cache_key("graph", spec, "cuda:0") != cache_key("graph", spec, "cpu", 2)


def test_a_cache_hit_compiles_nothing(warm_cache, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the compile function was called on a cache hit")

    monkeypatch.setattr(compilers, "start_inductor_compile", refuse)
    monkeypatch.setattr(compilers, "compile_inductor_artifact", refuse)
    fx, _ = _train("CSX", in_process=True, compiler="fx")
    cstorch.current_backend().shutdown()
    ind, ex = _train("CSX", in_process=True, compiler="inductor", compile_dir=warm_cache)
    assert ex.summary["compile"]["cache_hit"] is True
    assert ex.summary["compile"]["active"] == "inductor"
    assert ind == pytest.approx(fx, rel=1e-4)


CACHE_SCRIPT = textwrap.dedent("""
    import sys, torch
    from test_wafer import _train
    _, ex = _train("CSX", in_process=True, compiler="inductor", compile_dir=sys.argv[1])
    print("cache_hit", ex.summary["compile"]["cache_hit"])
""")


def test_a_second_process_running_the_same_script_reuses_the_artifact(warm_cache, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(CACHE_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(warm_cache)],
                         capture_output=True, text=True, timeout=300,
                         env=child_env())
    assert out.returncode == 0, out.stderr
    assert "cache_hit True" in out.stdout
    assert not list(warm_cache.glob("*/job.*.pkl"))  # no compile job was started


def test_tiered_compilation_checks_inductor_against_fx_then_keeps_the_faster_by_trial(
        warm_cache):
    fx, _ = _train("CSX", in_process=True, compiler="fx", steps=50)
    cstorch.current_backend().shutdown()
    auto, ex = _train("CSX", in_process=True, compiler="auto", compile_dir=warm_cache,
                      steps=50, lookahead=2)
    c = ex.summary["compile"]
    tier = c["tier_up"]
    assert c["cache_hit"] is True
    # step 1 ran on fx at once; the cached artifact was loaded after it and checked against
    # fx on step 2
    assert tier["agreed"] is True and tier["checked_at_step"] == 2
    assert tier["compiled_in_background"] is False and tier["ready_s"] > 0
    assert auto[:2] == fx[:2]
    # then the versions alternate for 2 x TIER_TRIAL_STEPS steps; fx stays only if its median
    # step time is TIER_UP_MIN_GAIN below inductor's
    trial = tier["trial"]
    assert trial["steps"] == [3, 2 + 2 * program.TIER_TRIAL_STEPS]
    assert trial["steps_each"] == program.TIER_TRIAL_STEPS
    assert trial["fx_median_s"] > 0 and trial["inductor_median_s"] > 0
    assert trial["chosen"] == c["active"]
    if trial["fx_median_s"] < (1 - program.TIER_UP_MIN_GAIN) * trial["inductor_median_s"]:
        assert c["active"] == "fx" and "switched_at_step" not in tier
        assert tier["kept_fx"].startswith("fx's median step in the trial (")
    else:
        assert c["active"] == "inductor" and tier["switched_at_step"] == trial["steps"][1] + 1
        assert "kept_fx" not in tier
    assert auto == pytest.approx(fx, rel=1e-4)
    profile = json.loads((ex.run_dir / "profile.json").read_text())
    assert profile["summary"]["compile"]["tier_up"]["trial"] == trial
    # the run summary's compiler row gives both candidates' medians
    row = dict(summary_lines(ex.report))["compiler"]
    assert row.startswith(f"{c['active']} {'chosen' if c['active'] == 'inductor' else 'kept'} "
                          f"by trial (fx {trial['fx_median_s'] * 1e3:.3g} ms, inductor ")
    assert row.endswith(f" ms a step, median of {program.TIER_TRIAL_STEPS} steps each)")


class _Slowed:
    """A compiled step that takes 50 ms longer: the trial must not keep it."""

    def __init__(self, step):
        self.step, self.compiler = step, step.compiler

    def __call__(self, *args):
        time.sleep(0.05)
        return self.step(*args)


@pytest.mark.parametrize("slowed", ["fx", "inductor"])
def test_the_tiering_trial_keeps_the_version_with_the_faster_steps(
        slowed, warm_cache, monkeypatch):
    factory = "fx_step" if slowed == "fx" else "load_inductor_artifact"
    made = getattr(compilers, factory)
    monkeypatch.setattr(compilers, factory, lambda *a, **k: _Slowed(made(*a, **k)))
    _, ex = _train("CSX", in_process=True, compiler="auto", compile_dir=warm_cache, steps=44)
    c = ex.summary["compile"]
    trial = c["tier_up"]["trial"]
    kept = "inductor" if slowed == "fx" else "fx"
    assert c["active"] == kept
    assert trial[f"{slowed}_median_s"] >= 0.05 and trial[f"{kept}_median_s"] > 0
    assert ("switched_at_step" in c["tier_up"]) == (kept == "inductor")


def test_a_short_run_stays_on_fx_and_says_why(tmp_path):
    _, ex = _train("CSX", in_process=True, compiler="auto", steps=30)
    c = ex.summary["compile"]
    assert c["active"] == "fx"
    assert "under 30 s" in c["tier_up"]["skipped"]


def test_a_ray_driver_reuses_the_artifact_an_in_process_run_compiled(warm_cache, ray_session):
    """The cache key is the captured graph's own code: the Ray driver receives the graph
    pickled, its code generated anew, yet finds what an in-process run on as many threads
    compiled (the thread count is part of the key: inductor's kernels are generated for it)."""
    entries = sorted(p.name for p in warm_cache.iterdir())
    ray_losses, ex = _train("CSX", compiler="inductor", compile_dir=warm_cache,
                            num_threads=torch.get_num_threads())
    cstorch.current_backend().shutdown()
    assert ex.summary["compile"]["cache_hit"] is True
    assert ex.summary["compile"]["active"] == "inductor"
    assert sorted(p.name for p in warm_cache.iterdir()) == entries  # no entry of its own
    fx, _ = _train("CSX", in_process=True, compiler="fx")
    assert ray_losses == pytest.approx(fx, rel=1e-4)


# -- the compute thread ---------------------------------------------------------------------------
def test_the_compute_thread_runs_calls_in_order_raises_their_errors_and_ends_when_closed():
    from executor.wafer.compute_thread import ComputeThread, ComputeThreadDied

    compute = ComputeThread(name="compute-test")
    order = []
    assert compute.call(lambda: threading.current_thread().name, "naming") == "compute-test"
    first = compute.submit(lambda: order.append(1))
    assert compute.call(lambda: order.append(2) or len(order), "appending") == 2
    assert first.done() and order == [1, 2]
    # a call made on the thread itself runs at once (no wait for itself)
    assert compute.call(lambda: compute.call(lambda: "inner", "nesting"), "outer") == "inner"
    with pytest.raises(ZeroDivisionError):
        compute.call(lambda: 1 / 0, "dividing")
    compute.close()
    compute._thread.join(timeout=5)
    assert not compute._thread.is_alive()
    with pytest.raises(ComputeThreadDied, match="before it finished storing the state"):
        compute.call(lambda: None, "storing the state")


def test_the_driver_runs_a_run_s_loop_on_its_one_compute_thread_which_ends_with_it():
    """libgomp slows every thread's parallel ops once two threads of a process keep pools of
    OpenMP threads: the state, the program and each run's steps are computed on one thread."""
    import traceback

    seen = []

    def on_closure(i):
        thread = cstorch.current_executor().run.driver.driver._compute._thread
        stack = traceback.extract_stack(sys._current_frames()[thread.ident])
        seen.append((thread.name, [f.name for f in stack if f.filename.endswith("loop.py")]))

    _train("CSX", in_process=True, compiler="fx", steps=8, lookahead=2, on_closure=on_closure)
    # the wafer is at most 2 steps ahead: until its last steps, the loop holds the thread
    assert [name for name, _ in seen] == ["wafer"] * 8
    assert all("run" in frames for _, frames in seen[:5]), seen
    thread = cstorch.current_backend().driver().driver._compute._thread
    cstorch.current_backend().shutdown()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_objects_a_run_starts_with_are_frozen_for_the_collector_until_it_ends():
    # a full collection on the driver scans every object of the process; those the run starts
    # with live through it, so they are frozen while it runs, and thawed after
    import gc

    assert gc.get_freeze_count() == 0
    during = []
    _train("CSX", in_process=True, compiler="fx", steps=8, lookahead=2,
           on_closure=lambda i: during.append(gc.get_freeze_count()))
    # the wafer is at most 2 steps ahead: until its last steps, its loop runs
    assert len(during) == 8 and min(during[:5]) > 1000, during
    cstorch.current_backend().shutdown()
    assert gc.get_freeze_count() == 0
