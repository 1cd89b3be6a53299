"""The foundation: API surface, CPU backend, DataLoader, DataExecutor, profiler, closures."""

from __future__ import annotations

import pytest
import torch

import cstream
import cstream as cstorch
import cstream.experimental as experimental
from executor.profiler import Profiler


def tiny_input_fn(n=3, batch=4):
    return [(torch.full((batch, 2), float(i)), torch.full((batch,), i)) for i in range(n)]


def make_executor(**kwargs):
    return cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(tiny_input_fn), **kwargs)


# -- API surface -------------------------------------------------------------------------------
NAMES = ["backend", "compile", "trace", "compile_step", "step_closure", "checkpoint_closure",
         "save", "load", "current_executor", "zeros", "ones", "full", "zeros_like", "ones_like",
         "full_like", "optim", "amp", "metrics", "utils", "distributed", "TracingError"]


@pytest.mark.parametrize("name", NAMES)
def test_the_top_level_and_experimental_expose_the_same_name(name):
    assert getattr(cstream, name) is getattr(experimental, name)


def test_utils_and_data_names_exist():
    assert cstorch.utils.CSConfig and cstorch.utils.data.DataLoader
    assert cstorch.utils.data.DataExecutor and cstorch.utils.data.Schedule
    assert cstorch.compile_step is cstorch.trace


# -- backends ----------------------------------------------------------------------------------
def test_one_backend_at_a_time_and_the_error_says_how_to_get_the_current_one():
    b = cstorch.backend("CPU")
    with pytest.raises(RuntimeError, match=r"cstream.current_backend\(\).*\.shutdown\(\)"):
        cstorch.backend("CPU")
    assert cstorch.current_backend() is b
    b.shutdown()
    assert cstorch.current_backend() is None
    cstorch.backend("CPU").shutdown()


def test_backend_options_are_checked_with_the_right_spelling():
    with pytest.raises(TypeError, match="unknown option 'max_checkpoint'. Did you mean "
                                        "'max_checkpoints'"):
        cstorch.backend("CPU", max_checkpoint=3)
    with pytest.raises(ValueError, match="unknown backend type 'TPU'"):
        cstorch.backend("TPU")
    with pytest.raises(ValueError, match="max_checkpoints: expected a positive int"):
        cstorch.backend("CPU", max_checkpoints=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_the_gpu_backend_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"needs a CUDA device.*backend\(\"CPU\"\)"):
        cstorch.backend("GPU")


def test_cpu_backend_device_is_a_context_manager_and_compile_wraps_the_model():
    b = cstorch.backend("CPU")
    with b.device:
        model = torch.nn.Linear(2, 1)
    compiled = cstorch.compile(model, b)
    assert compiled(torch.ones(3, 2)).shape == (3, 1)
    assert compiled.eval() is compiled and not model.training
    assert compiled.weight is model.weight
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        cstorch.compile("model", b)


def test_compile_with_a_backend_name_creates_or_reuses_the_backend():
    compiled = cstorch.compile(torch.nn.Linear(2, 1), "CPU")
    assert cstorch.current_backend().name == "CPU"
    cstorch.compile(torch.nn.Linear(2, 1), "cpu")
    assert compiled.backend is cstorch.current_backend()


# -- CSConfig ----------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("num_csx", 0), ("num_workers_per_csx", "four"),
                                         ("num_csx", True), ("num_workers_per_csx", -1)])
def test_csconfig_rejects_non_positive_ints(field, value):
    with pytest.raises(ValueError, match=f"CSConfig.{field}: expected a positive int, got"):
        cstorch.utils.CSConfig(**{field: value})


def test_csconfig_is_accepted_by_executor_and_counts_workers():
    cfg = cstorch.utils.CSConfig(num_csx=2, num_workers_per_csx=3)
    assert cfg.total_num_workers == 6
    cstorch.backend("CPU")
    assert make_executor(num_steps=1, cs_config=cfg).cs_config is cfg
    with pytest.raises(TypeError, match="cs_config: expected cstream.utils.CSConfig"):
        make_executor(num_steps=1, cs_config={"num_csx": 1})


# -- DataLoader --------------------------------------------------------------------------------
def test_dataloader_needs_a_callable_input_fn():
    with pytest.raises(TypeError, match=r"(?s)input_fn to be a callable.*got list.*not input_fn\(\.\.\.\)"):
        cstorch.utils.data.DataLoader(tiny_input_fn())


def test_dataloader_deep_copies_its_arguments_for_each_worker():
    seen = []

    def input_fn(config):
        seen.append(config)
        config["mutated"] = True
        return [torch.zeros(1)]

    config = {"a": [1, 2]}
    loader = cstorch.utils.data.DataLoader(input_fn, config)
    config["a"].append(3)  # a later change does not reach the workers
    loader.build()
    loader.build()
    assert seen[0] == {"a": [1, 2], "mutated": True} and seen[0] is not seen[1]
    assert "mutated" not in seen[1] or seen[1] is not seen[0]
    assert config == {"a": [1, 2, 3]}


def test_dataloader_len_comes_from_what_input_fn_returns():
    assert len(cstorch.utils.data.DataLoader(tiny_input_fn, 5)) == 5
    assert len(cstorch.utils.data.DataLoader(
        lambda: torch.utils.data.DataLoader(torch.arange(10), batch_size=3))) == 4
    with pytest.raises(TypeError, match="has no len"):
        len(cstorch.utils.data.DataLoader(lambda: iter([torch.ones(1)])))


def test_an_input_fn_that_yields_no_batch_says_so_and_suggests_batch_size():
    cstorch.backend("CPU")
    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(
        lambda: torch.utils.data.DataLoader(torch.arange(3), batch_size=8, drop_last=True)),
        num_steps=2)
    with pytest.raises(cstorch.utils.data.EmptyDataLoaderError,
                       match="yields no batch.*batch_size.*drop_last"):
        for _ in executor:
            pass


def test_nested_batches_of_tensors_reach_the_step_unchanged():
    cstorch.backend("CPU")

    def input_fn():
        return [{"x": torch.ones(2, 3), "y": (torch.zeros(2), [torch.arange(2)])}] * 2

    got = [b for b in cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(input_fn), num_steps=2)]
    assert torch.equal(got[0]["y"][1][0], torch.arange(2))


# -- DataExecutor ------------------------------------------------------------------------------
def test_num_steps_is_inferred_from_len_and_the_dataloader_is_cycled():
    cstorch.backend("CPU")
    assert make_executor().num_steps == 3
    values = [float(b[0][0, 0]) for b in make_executor(num_steps=7)]
    assert values == [0, 1, 2, 0, 1, 2, 0]


def test_num_steps_errors():
    cstorch.backend("CPU")
    with pytest.raises(ValueError, match="num_steps: expected a positive int, got 0"):
        make_executor(num_steps=0)
    with pytest.raises(ValueError, match="has no len\\(\\); pass num_steps"):
        cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(
            lambda: iter([torch.ones(1)])))


def test_a_misspelled_keyword_names_the_right_spelling():
    cstorch.backend("CPU")
    with pytest.raises(TypeError, match="'chekpoint_steps'. Did you mean 'checkpoint_steps'"):
        make_executor(num_steps=3, chekpoint_steps=1)


def test_a_torch_dataloader_is_rejected_with_guidance():
    cstorch.backend("CPU")
    with pytest.raises(TypeError, match=r"Wrap the function that builds your dataloader"):
        cstorch.utils.data.DataExecutor(torch.utils.data.DataLoader(torch.arange(4)), num_steps=1)


def test_an_executor_iterates_once_and_tracks_its_iteration():
    cstorch.backend("CPU")
    executor = make_executor(num_steps=3)
    seen = [(executor.iteration, executor.user_iteration, executor.on_final_iteration)
            for _ in executor]
    assert seen == [(0, 1, False), (1, 2, False), (2, 3, True)]
    with pytest.raises(RuntimeError, match="already been iterated; an executor runs once"):
        for _ in executor:
            pass


def test_checkpoint_steps_every_n_and_the_final_step_or_a_schedule():
    cstorch.backend("CPU")
    ex = make_executor(num_steps=7, checkpoint_steps=3)
    assert ex.checkpoint_iterations() == [2, 5, 6]
    Range = cstorch.utils.data.Schedule.Range
    sched = cstorch.utils.data.Schedule([Range(start=1, end=4, step=2, include_last=False),
                                         Range(start=4, end=7, step=5, include_last=True)])
    # a Schedule names 0-based iterations, exactly those (no implied final step)
    assert make_executor(num_steps=8, checkpoint_steps=sched).checkpoint_iterations() == [
        1, 3, 4, 6]
    assert make_executor(num_steps=3, checkpoint_steps=0).checkpoint_iterations() == []
    with pytest.raises(ValueError, match=r"checkpoint_steps: expected an int >= 0"):
        make_executor(num_steps=3, checkpoint_steps=-1)


# -- closures ----------------------------------------------------------------------------------
def test_step_closures_run_at_the_end_of_the_step_with_the_last_value():
    cstorch.backend("CPU")
    order = []

    @cstorch.step_closure
    def closure(t):
        order.append(("closure", t.clone()))

    for i, _ in enumerate(make_executor(num_steps=2)):
        t = torch.zeros(1)
        closure(t)
        order.append(("body", i))
        t.add_(5)  # an in-place change after the call is what the closure sees
    assert [o[0] for o in order] == ["body", "closure", "body", "closure"]
    assert float(order[1][1]) == 5.0


def test_checkpoint_closures_run_on_checkpoint_steps_and_before_the_first_step():
    ran = []

    @cstorch.checkpoint_closure
    def save(step):
        ran.append(step)

    with pytest.raises(RuntimeError, match="with no backend and no DataExecutor run"):
        save(0)
    cstorch.backend("CPU")
    save(0)  # before the run: runs as the next run starts (save_initial_checkpoint)
    assert ran == []
    for i, _ in enumerate(make_executor(num_steps=5, checkpoint_steps=2)):
        save(i)
    assert ran == [0, 1, 3, 4]


def test_current_executor_is_the_one_being_iterated():
    cstorch.backend("CPU")
    ex = make_executor(num_steps=1)
    for _ in ex:
        assert cstorch.current_executor() is ex
    assert cstorch.current_executor() is None


# -- profiler ----------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_rate_is_smoothed_over_the_window_since_the_previous_query():
    clock = Clock()
    p = Profiler(clock=clock)
    p.step_done(10)                 # t = 0: the first step ends
    clock.t = 1.0
    p.step_done(100)
    assert p.rate() == pytest.approx(100.0)           # 100 samples in 1 s, first query
    clock.t = 3.0
    p.step_done(400)
    assert p.rate() == pytest.approx(0.6 * 200 + 0.4 * 100)  # 400 in 2 s, smoothed


def test_global_rate_counts_the_samples_after_the_first_step_from_its_end():
    clock = Clock()
    p = Profiler(clock=clock)
    clock.t = 50.0                  # start-up and compile: left out
    p.step_done(10)                 # produced before the clock started: left out
    assert p.global_rate() == 0.0   # never a rate over a window of nearly zero length
    clock.t = 52.0
    p.step_done(30)
    assert p.global_rate() == pytest.approx(30 / 2.0)


def test_after_the_run_the_figures_are_read_when_the_wafer_ended_the_last_step():
    clock = Clock()
    p = Profiler(clock=clock)
    p.step_done(10)
    clock.t = 2.0
    p.step_done(40)                 # the client queued it; the wafer ends it at t = 4
    clock.t = 5.0                   # the run shuts down: not part of its throughput
    p.finish(last_step_ran=4.0)
    clock.t = 9.0                   # the user reads the figures after the loop
    assert p.global_rate() == pytest.approx(40 / 4.0)
    assert p.rate() == pytest.approx(40 / 4.0)
    assert p.total_time() == pytest.approx(4.0)
    p.finish(last_step_ran=8.0)     # a second call keeps the first end
    assert p.global_rate() == pytest.approx(40 / 4.0)


def test_without_a_wafer_figure_the_run_ends_when_the_client_ended_its_last_step():
    clock = Clock()
    p = Profiler(clock=clock)
    p.step_done(10)
    clock.t = 2.0
    p.step_done(40)
    clock.t = 3.0
    p.finish(last_step_ran=None)
    clock.t = 9.0
    assert p.global_rate() == pytest.approx(40 / 2.0)


def test_where_the_wafer_ended_the_steps_the_figures_are_read_at_its_step_ends():
    clock = Clock()
    p = Profiler(clock=clock)
    wafer = {}                      # step -> when the wafer ended it
    p.time_steps_by(lambda step, after: next(
        ((k, wafer[k]) for k in range(step, after, -1) if k in wafer), None))
    for _ in range(4):              # the client counts steps 1-4 as it queues them
        p.step_done(10)
    wafer.update({1: 1.0, 2: 1.5, 3: 2.0})              # one collect brings steps 1-3
    clock.t = 9.0                   # the client's closures run late: not the wafer's pace
    assert p.global_rate() == pytest.approx(20 / 1.0)   # steps 2-3 over 1.0 s to step 3's end
    assert p.rate() == pytest.approx(20 / (2.0 - 1.0))  # the window: step 1's end to step 3's
    wafer[4] = 3.0
    assert p.rate() == pytest.approx(0.6 * 10 / 1.0 + 0.4 * 20)  # step 4 in 1.0 s, smoothed
    assert p.rate() == pytest.approx(0.6 * 10 + 0.4 * 20)   # nothing new: the last figure
    p.step_done(10)                 # step 5's end is not back: read at step 4's
    clock.t = 11.0
    assert p.global_rate() == pytest.approx(30 / (3.0 - 1.0))
    p.finish(last_step_ran=12.0)
    clock.t = 20.0
    assert p.global_rate() == pytest.approx(40 / (12.0 - 1.0))


def test_where_no_wafer_end_comes_back_the_figures_are_read_on_the_clients_clock():
    clock = Clock()
    p = Profiler(clock=clock)
    p.time_steps_by(lambda step, after: None)  # closures that read no output: nothing back
    p.step_done(10)
    clock.t = 2.0
    p.step_done(10)
    p.step_done(10)
    clock.t = 4.0
    assert p.rate() == pytest.approx(20 / 4.0)
    assert p.global_rate() == pytest.approx(20 / 4.0)


def test_unknown_profiler_activities_are_refused():
    with pytest.raises(ValueError, match="unknown activity 'flops'"):
        Profiler(["rate", "flops"])
    with pytest.raises(RuntimeError, match="not enabled"):
        Profiler(["rate"]).global_rate()


def test_the_writer_receives_rate_and_global_rate_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    cstorch.backend("CPU")
    writer = SummaryWriter(str(tmp_path / "tb"))
    for _ in make_executor(num_steps=4, writer=writer):
        pass
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("rate")] == [1, 2, 3, 4]
    assert [e.step for e in acc.Scalars("global_rate")] == [1, 2, 3, 4]


def test_a_run_leaves_its_profile_in_the_artifact_dir(tmp_path):
    import json

    cstorch.backend("CPU", artifact_dir=tmp_path)
    for _ in make_executor(num_steps=2):
        pass
    profile = json.loads((tmp_path / "executors" / "latest" / "profile.json").read_text())
    assert profile["steps_run"] == 2 and profile["total_samples"] == 8


def test_worker_info_outside_a_worker_is_worker_0_of_1():
    info = cstorch.distributed.get_worker_info()
    assert (info.global_worker_id, info.total_num_workers, info.wse_id) == (0, 1, 0)


def test_the_seeds_typos_get_errors_that_name_the_intended_spelling():
    cstorch.backend("CPU")
    opt = cstorch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(AttributeError, match="Did you mean 'load_state_dict'"):
        opt.load_state_dictt({})
    loader = cstorch.utils.data.DataLoader(tiny_input_fn)

    @cstorch.trace
    def training_step(batch):
        return batch

    with pytest.raises(TypeError, match="called with the cstream DataLoader itself"):
        training_step(loader)


def test_the_eval_examples_dataloader_for_dataexecutor_typo_points_to_dataexecutor():
    loader = cstorch.utils.data.DataLoader(tiny_input_fn)
    with pytest.raises(TypeError, match=r"build an executor: cstream.utils.data.DataExecutor"):
        cstorch.utils.data.DataLoader(loader, num_steps=100)
