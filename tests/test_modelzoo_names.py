"""The names Release 2.3-2.10 of the Model Zoo import from ``cerebras.pytorch`` and
``cerebras.appliance``: that they resolve, that the ones that compute give the real package's
numbers (``reference/fixtures/names.json``, written by ``reference/gen_names.py`` with the real
cerebras-pytorch 2.10), that the settings tree checks what is set as the real one does, that the
half dtype reaches an input worker's DataLoader processes, and a loop shaped like the 2.10
Trainer's (callbacks around a DataExecutor, on the utilities the Trainer imports)."""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest
import torch

import cerebras.pytorch as cstorch
from reference.tolerance import assert_tensor_close
from tools.modelzoo_names import resolves

FIXTURE = json.loads((pathlib.Path(__file__).parent / "reference" / "fixtures"
                      / "names.json").read_text())

# What 2.10's cerebras.modelzoo.trainer (its Trainer, default callbacks and loggers), cli/ and
# common/run_utils.py import at module level or call on every run.
TRAINER_NAMES = [
    "cerebras.pytorch.utils.data.utils.Schedule", "cerebras.pytorch.utils.data.utils.Schedule.Range",
    "cerebras.pytorch.utils.data.utils.infer_batch_size", "cerebras.pytorch.backend.Backend",
    "cerebras.pytorch.backend.BackendType.from_str", "cerebras.pytorch.backend.get_backend_args",
    "cerebras.pytorch.backend.ltc_backend.register_after_tensor_to_cpu",
    "cerebras.pytorch.backends.csx.precision.optimization_level",
    "cerebras.pytorch.backends.csx.performance.micro_batch_size",
    "cerebras.pytorch.backends.csx.debug.debug_args.MergeFrom",
    "cerebras.pytorch.backends.csx.debug.ini", "cerebras.pytorch.backends.csx.cluster.auto_taint",
    "cerebras.pytorch.backends.csx.storage.s3.profile", "cerebras.pytorch.distributed.ClusterConfig",
    "cerebras.pytorch.experimental.listener.register_traced_tensor_hook",
    "cerebras.pytorch.storage.serializers.use_external_link", "cerebras.pytorch.nn.SelectiveGrad",
    "cerebras.pytorch.sparse.configure.default_sparse_param_filter",
    "cerebras.pytorch.utils.call_once.call_once", "cerebras.pytorch.utils.benchmark.benchmark_dataloader",
    "cerebras.appliance.log.ClassLogger", "cerebras.appliance.log.named_class_logger",
    "cerebras.appliance.storage.StorageWriter.path_exists",
    "cerebras.appliance.storage.base_storage.StorageDeleter.get",
    "cerebras.appliance.cluster.client.TelemetryClient",
    "cerebras.appliance.utils.classes.retrieve_all_subclasses",
    "cerebras.appliance.utils.debug_args.get_debug_args", "cerebras.appliance.utils.ini.set_default_ini",
    "cerebras.appliance.utils.units.bytes_to_human",
]


@pytest.mark.parametrize("name", TRAINER_NAMES)
def test_a_name_the_210_trainer_imports_resolves(name):
    assert resolves(name) == (True, "")


# -- the real package's numbers ---------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(k for k in FIXTURE["schedule"] if k != "errors"))
def test_the_checkpoint_schedule_matches_the_real_one(case):
    from cerebras.pytorch.utils.data.utils import Schedule

    ref = FIXTURE["schedule"][case]
    s = Schedule([Schedule.Range(*r) for r in ref["ranges"]])
    assert (list(s), len(s), [i for i in range(14) if s.match(i)], s.start, s.final_step) == (
        ref["items"], ref["len"], ref["match"], ref["start"], ref["final_step"])
    assert [s.next_immediate_step(t) if s.final_step is None or t <= s.final_step else None
            for t in range(12)] == ref["next"]
    if ref["next_error"]:
        with pytest.raises(ValueError) as e:
            s.next_immediate_step(99)
        assert [type(e.value).__name__, str(e.value)] == ref["next_error"]


def test_a_bad_schedule_is_refused_with_the_real_messages():
    from cerebras.pytorch.utils.data.utils import Schedule

    R = Schedule.Range
    made = {"negative_start": lambda: R(-1, 3, 1, False), "end_not_after_start": lambda: R(3, 3, 1, False),
            "zero_step": lambda: R(0, 3, 0, False), "include_last_not_bool": lambda: R(0, 3, 1, 1),
            "overlap": lambda: Schedule([R(0, 5, 1, False), R(4, 8, 1, False)]),
            "not_a_range": lambda: Schedule([3])}
    for name, make in made.items():
        with pytest.raises(ValueError) as e:
            make()
        ref = FIXTURE["schedule"]["errors"][name][1]
        # the class is named by its module: the real package's path differs from cstream's
        assert str(e.value).replace("executor.schedule", "cerebras.pytorch.utils.data.utils") == ref


def _tensors(shapes):
    if isinstance(shapes, dict):
        return {k: _tensors(v) for k, v in shapes.items()}
    if isinstance(shapes, list) and all(isinstance(v, int) for v in shapes):
        return torch.zeros(shapes)
    return [_tensors(v) for v in shapes]


@pytest.mark.parametrize("case", sorted(k for k in FIXTURE["infer_batch_size"] if k != "no_tensors"))
def test_infer_batch_size_answers_and_warns_as_the_real_one(case):
    from cerebras.pytorch.utils.data.utils import infer_batch_size

    ref = FIXTURE["infer_batch_size"][case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = infer_batch_size(_tensors(ref["shapes"]), ref["batch_size"])
    assert (got, [str(w.message) for w in caught]) == (ref["result"], ref["warnings"])


def test_infer_batch_size_without_tensors_and_on_a_csx_it_is_an_error():
    from cerebras.pytorch.utils.data.utils import infer_batch_size

    with pytest.raises(RuntimeError) as e:
        infer_batch_size({"a": 1})
    assert str(e.value) == FIXTURE["infer_batch_size"]["no_tensors"]["error"][1]
    from workers.context import streamer_context

    with streamer_context(), pytest.raises(RuntimeError, match=r"^Only uniform batch sizes .* "
                                                               r"batch sizes 8 and 4\. Make sure"):
        infer_batch_size({"x": torch.zeros(4)}, 8)


def test_parameter_filters_match_as_the_real_ones():
    from cerebras.pytorch.sparse.configure import default_sparse_param_filter
    from cerebras.pytorch.utils.utils import convert_glob_to_regex, make_param_filter

    ref = FIXTURE["filters"]
    params = {n: torch.zeros(ref["shapes"][n]) for n in ref["names"]}
    for key, glob in ref["glob_args"].items():
        f = make_param_filter(glob)
        assert [f(n, params[n]) for n in ref["names"]] == ref["globs"][key], key
    assert {g: convert_glob_to_regex(g).pattern for g in ref["regex"]} == ref["regex"]
    assert [default_sparse_param_filter(n, params[n]) for n in ref["names"]] == ref["default_sparse"]
    with pytest.raises(ValueError, match=r"^Unknown `param_filter`: .* Valid options are a string"):
        make_param_filter(lambda x: x)


def test_bytes_to_human_writes_the_real_strings():
    from cerebras.appliance.utils.units import bytes_to_human

    ref = FIXTURE["units"]
    assert [bytes_to_human(n) for n in ref["nums"]] == ref["base2"]
    assert [bytes_to_human(n, log_base=10) for n in ref["nums"]] == ref["base10"]
    assert bytes_to_human(2048, fmt="{value:.0f} {unit}") == ref["fmt"]
    with pytest.raises(ValueError, match=r"^Invalid `log_base`: 3$"):
        bytes_to_human(1, log_base=3)


def _t(values, like):
    return torch.tensor(values, dtype=torch.float32).reshape(like)


def test_the_ops_compute_the_real_values():
    ops = FIXTURE["ops"]
    loop = ops["loop"]
    from cerebras.pytorch.experimental import get_loop_iteration_slice

    assert get_loop_iteration_slice(torch.tensor(loop["tokens"]),
                                    torch.tensor(loop["index"])).tolist() == loop["out"]
    sm = ops["sparse_matmul"]
    indices = torch.tensor(sm["indices"])
    values = _t(sm["values"], (*indices.shape, 5))
    weight = _t(sm["weight"], (7, 6, 5))
    out = cstorch.nn.functional.sparse_matmul(values, indices, weight)
    # one matmul of 5 products: one step of float32 noise between two programs
    assert_tensor_close(out, _t(sm["out"], out.shape), 1, "sparse_matmul")
    am = ops["sparse_act_matmul"]
    mask = torch.tensor(am["mask"])
    act = cstorch.nn.functional.sparse_act_matmul(_t(am["value"], (2, 3, 5)), mask,
                                                  _t(am["weight"], (4, 5)))
    assert_tensor_close(act, _t(am["out"], act.shape), 1, "sparse_act_matmul")
    assert (act[mask == 0] == 0).all()
    sl = ops["smooth_l1"]
    pred, target = _t(sl["pred"], (3, 4)), _t(sl["target"], (3, 4))
    for key, expected in sl["losses"].items():
        reduction, beta = key.rsplit("_", 1)
        loss = cstorch.nn.SmoothL1Loss(reduction=reduction, beta=float(beta))(pred, target)
        assert_tensor_close(loss, _t(expected, loss.shape), 1, f"SmoothL1Loss {key}")


def _benchmark_input_fn():
    data = [{"x": torch.zeros(4, 3), "y": torch.zeros(4, dtype=torch.int32)}] * 5
    return data + [{"x": torch.zeros(2, 3), "y": torch.zeros(2, dtype=torch.int32)}]


@pytest.mark.parametrize("case", ["two_epochs", "capped"])
def test_benchmark_dataloader_counts_as_the_real_one(case):
    ref = FIXTURE["benchmark"][case]
    m = cstorch.utils.benchmark.benchmark_dataloader(_benchmark_input_fn, print_metrics=False,
                                                     **ref["kwargs"])
    assert (m.total_steps, [e.total_steps for e in m.epoch_metrics],
            [[b.epoch_step for b in e.batch_metrics] for e in m.epoch_metrics],
            [[b.global_step for b in e.batch_metrics] for e in m.epoch_metrics],
            [[[list(t.shape) for t in s.tensors], o.epoch, o.epoch_step, o.count]
             for s, o in m.batch_specs.items()],
            m.global_sample_rate is not None, m.is_partial) == (
        ref["total_steps"], ref["epoch_steps"], ref["sampled"], ref["sampled_global"],
        ref["specs"], ref["has_sample_rate"], ref["is_partial"])


def test_benchmark_dataloader_refuses_bad_arguments_with_the_real_messages():
    bench = cstorch.utils.benchmark.benchmark_dataloader
    calls = {"num_epochs": dict(num_epochs=0), "steps_per_epoch": dict(steps_per_epoch=0),
             "sampling_frequency": dict(sampling_frequency=-1)}
    for key, kw in calls.items():
        with pytest.raises(ValueError) as e:
            bench(_benchmark_input_fn, print_metrics=False, **kw)
        assert [type(e.value).__name__, str(e.value)] == FIXTURE["benchmark"]["errors"][key]
    with pytest.raises(RuntimeError) as e:
        bench(lambda: [], print_metrics=False)
    assert str(e.value) == FIXTURE["benchmark"]["errors"]["empty"][1]


# -- the settings tree --------------------------------------------------------------------------
@pytest.fixture
def csx_settings():
    csx = cstorch.backends.csx
    csx.reset()
    yield csx
    csx.reset()


def test_the_settings_tree_has_the_real_defaults(csx_settings):
    for group, ref in FIXTURE["settings"]["defaults"].items():
        got = {k: v for k, v in getattr(csx_settings, group).asdict().items()
               if k not in ("ini", "debug_args")}
        assert got == ref, group


def test_a_bad_setting_is_refused_with_the_real_message(csx_settings):
    bad = {"precision.optimization_level=3": ("precision", "optimization_level", 3),
           "precision.optimization_level='1'": ("precision", "optimization_level", "1"),
           "performance.micro_batch_size=0": ("performance", "micro_batch_size", 0),
           "performance.transfer_processes=0": ("performance", "transfer_processes", 0),
           "performance.compress_weights=1": ("performance", "compress_weights", 1),
           "debug.drop_data='x'": ("debug", "drop_data", "x"),
           "debug.nope=1": ("debug", "nope", 1)}
    for key, (group, name, value) in bad.items():
        with pytest.raises(Exception) as e:
            setattr(getattr(csx_settings, group), name, value)
        assert [type(e.value).__name__, str(e.value)] == FIXTURE["settings"]["errors"][key], key
    with pytest.raises(AttributeError) as e:
        csx_settings.precision = 1
    assert str(e.value) == FIXTURE["settings"]["errors"]["csx.precision=1"][1]


def test_settings_reset_restore_on_exit_and_are_listed_when_changed(csx_settings):
    from cstream.backends import changed_settings

    csx_settings.precision.optimization_level = 2
    with csx_settings.performance:
        csx_settings.performance.transfer_processes = 3
        assert csx_settings.performance.transfer_processes == 3
    assert csx_settings.performance.transfer_processes == 5
    csx_settings.debug.ini.ws_opt_example = True
    # the INI flags are the debug args' (restoring the performance group re-set its own flag)
    assert csx_settings.debug.debug_args.to_dict()["ini"] == {
        "ws_opt_example": True, "ws_opt_disable_speculate_optimizer": False}
    assert changed_settings()["csx.precision.optimization_level"] == 2
    csx_settings.precision.optimization_level = cstorch.backends.DEFAULT
    assert csx_settings.precision.optimization_level == 1
    for value, stored in (("auto", "auto"), (None, None), (8, 8)):
        csx_settings.performance.micro_batch_size = value
        assert csx_settings.performance.micro_batch_size == stored


def test_debug_args_merged_into_the_settings_show_in_its_ini(csx_settings):
    from cerebras.appliance.utils.debug_args import DebugArgs, get_debug_args

    extra = DebugArgs()
    extra.ini.ws_from_file = 3
    extra.debug_usr.worker_resource.memory_bytes = 1 << 30
    csx_settings.debug.debug_args.MergeFrom(get_debug_args(extra))
    assert csx_settings.debug.ini.ws_from_file == 3
    assert csx_settings.debug.debug_args.debug_usr.worker_resource.memory_bytes == 1 << 30


def test_cluster_config_has_the_real_defaults_and_checks():
    from cerebras.pytorch.backend import BackendType
    from cerebras.pytorch.distributed import ClusterConfig

    ref = FIXTURE["settings"]
    c = ClusterConfig()
    assert {k: getattr(c, k) for k in ref["cluster_defaults"]} == ref["cluster_defaults"]
    for key, value in (("num_csx", -1), ("job_time_sec", 0), ("job_priority", "x")):
        with pytest.raises(ValueError) as e:
            ClusterConfig(**{key: value})
        assert str(e.value) == ref["cluster_errors"][key][1]
    assert BackendType.from_str("csx").name == ref["backend_type"]["csx"]
    assert BackendType.from_str("Cpu").name == ref["backend_type"]["Cpu"]
    with pytest.raises(ValueError) as e:
        BackendType.from_str("TPU")
    assert str(e.value) == ref["backend_type"]["TPU"][1]


# -- the half dtype in every process ------------------------------------------------------------------
class _HalfDtypeProbe(torch.utils.data.Dataset):
    """What a Model Zoo data processor sees in a DataLoader worker process: the half dtype it
    casts images to, whether mixed precision is on, and the process."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import os

        import cerebras.pytorch as cstorch  # in the DataLoader worker process

        image = torch.full((2,), 1.5).to(cstorch.amp.get_half_dtype())
        return {"image": image,
                "info": torch.tensor([int(cstorch.amp.mixed_precision()),
                                      int(cstorch.amp.get_half_dtype() == torch.bfloat16),
                                      os.getpid()])}


def half_dtype_input_fn():
    return torch.utils.data.DataLoader(_HalfDtypeProbe(), batch_size=2, num_workers=2)


@pytest.mark.timeout(600)
def test_the_half_dtype_reaches_the_dataloader_processes_of_a_ray_input_worker(ray_session):
    import os

    from workers.config import CSConfig
    from workers.dataloader import DataLoader
    from workers.flow import FlowPolicy
    from workers.stream import CsxInputStream

    cstorch.amp.set_half_dtype("bfloat16")
    assert os.environ["CEREBRAS_FP16_DTYPE"] == "bfloat16"
    cfg = CSConfig(num_csx=1, num_workers_per_csx=1)
    stream = CsxInputStream(DataLoader(half_dtype_input_fn), cfg, 0,
                            policy=FlowPolicy.from_config(cfg), name_prefix="halfdtype")
    try:
        batches = [stream.next()[0] for _ in range(2)]
    finally:
        stream.close()
    for batch in batches:
        assert batch["image"].dtype == torch.bfloat16
        assert batch["info"][:, :2].tolist() == [[1, 1], [1, 1]]  # mixed precision on, bfloat16
        assert os.getpid() not in batch["info"][:, 2].tolist()  # made in other processes


def test_the_half_dtype_cannot_be_changed_inside_an_input_worker():
    from workers.context import streamer_context

    with streamer_context(), pytest.raises(RuntimeError, match=r"^Setting the half dtype in the "
                                                               r"dataloader is not allowed"):
        cstorch.amp.set_half_dtype("bfloat16")


# -- a loop shaped like the 2.10 Trainer's -----------------------------------------------------
def _trainer_style_run(tmp_path, backend_type, **backend_kwargs):
    """A small Trainer: callbacks with class loggers around a DataExecutor whose checkpoint
    schedule is a Schedule, the backend made from its arguments' names, the settings tree set
    by a flags callback, batch sizes from infer_batch_size, checkpoints kept by the storage
    classes, step outputs timed by the after-tensor-to-cpu hook."""
    from cerebras.appliance.log import ClassLogger, named_class_logger
    from cerebras.appliance.storage import StorageDeleter, StorageWriter
    from cerebras.pytorch.backend import BackendType, get_backend_args
    from cerebras.pytorch.backend.ltc_backend import register_after_tensor_to_cpu
    from cerebras.pytorch.utils.data.utils import Schedule, infer_batch_size

    events = []

    class Callback:
        def on_fit_start(self, trainer): ...

        def on_batch_end(self, trainer, batch, loss): ...

        def on_save_checkpoint(self, trainer, path): ...

    @named_class_logger("GlobalFlags")
    class GlobalFlags(Callback, ClassLogger):
        def on_fit_start(self, trainer):
            cstorch.backends.csx.precision.optimization_level = 2
            self.logger.verbose("flags set")
            events.append(("flags", cstorch.backends.csx.precision.optimization_level))

    @named_class_logger
    class Throughput(Callback, ClassLogger):
        def __init__(self):
            self.batch_size = None
            self.samples = 0

        def on_batch_end(self, trainer, batch, loss):
            self.batch_size = infer_batch_size(batch, self.batch_size)
            self.samples += self.batch_size

    class KeepCheckpoints(Callback):
        def __init__(self, keep):
            self.keep, self.paths = keep, []

        def on_save_checkpoint(self, trainer, path):
            assert StorageWriter.is_valid_path(str(path)) and StorageWriter.path_exists(str(path))
            self.paths.append(str(path))
            while len(self.paths) > self.keep:
                assert StorageDeleter.get(self.paths.pop(0)).delete()
            events.append(("checkpoint", trainer.executor.user_iteration))

    callbacks = [GlobalFlags(), Throughput(), KeepCheckpoints(keep=2)]
    received = []
    handle = register_after_tensor_to_cpu(lambda tensor, name: received.append(name))
    args = {name for name in get_backend_args(backend_type) if name not in ("self", "backend_type")}
    kwargs = {k: v for k, v in {"artifact_dir": str(tmp_path), **backend_kwargs}.items()
              if k in args}
    backend = cstorch.backend(BackendType.from_str(backend_type).name, **kwargs)

    class Trainer:
        pass

    trainer = Trainer()
    try:
        torch.manual_seed(0)
        with backend.device:
            model = torch.nn.Linear(3, 2)
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

        @cstorch.trace
        def training_step(batch):
            loss = torch.nn.functional.mse_loss(compiled(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        @cstorch.step_closure
        def batch_end(batch, loss):
            for cb in callbacks:
                cb.on_batch_end(trainer, batch, loss)
            events.append(("loss", float(loss.detach())))

        @cstorch.checkpoint_closure
        def save(step):
            path = tmp_path / f"checkpoint_{step}.mdl"
            cstorch.save({"model": model.state_dict()}, path)
            for cb in callbacks:
                cb.on_save_checkpoint(trainer, path)

        schedule = Schedule([Schedule.Range(start=1, end=6, step=2, include_last=True)])
        trainer.executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(_trainer_input_fn), num_steps=6,
            checkpoint_steps=schedule)
        for cb in callbacks:
            cb.on_fit_start(trainer)
        for batch in trainer.executor:
            loss = training_step(batch)
            batch_end(batch, loss)
            if trainer.executor.on_checkpoint_step:
                save(trainer.executor.user_iteration)
    finally:
        handle.remove()
        backend.shutdown()
        cstorch.backends.csx.reset()
    return events, callbacks, received, sorted(p.name for p in tmp_path.glob("*.mdl"))


def _trainer_input_fn():
    g = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, 2, generator=g)}
            for _ in range(3)]


def test_a_trainer_style_loop_with_callbacks_runs_on_the_210_utilities(tmp_path):
    events, callbacks, received, kept = _trainer_style_run(tmp_path, "cpu")
    assert events[0] == ("flags", 2)
    # iterations 1, 3 and the last (5) are checkpointed: steps 2, 4, 6
    assert [e for e in events if e[0] == "checkpoint"] == [("checkpoint", 2), ("checkpoint", 4),
                                                          ("checkpoint", 6)]
    assert [e[0] for e in events[1:]] == ["loss", "loss", "checkpoint", "loss", "loss",
                                          "checkpoint", "loss", "loss", "checkpoint"]
    assert kept == ["checkpoint_4.mdl", "checkpoint_6.mdl"]  # the oldest deleted, 2 kept
    assert (callbacks[1].batch_size, callbacks[1].samples) == (4, 24)
    assert received == []  # the CPU backend fetches nothing from a wafer
    assert cstorch.backends.csx.precision.optimization_level == 1  # reset after the run


@pytest.mark.timeout(600)
def test_the_trainer_style_loop_on_csx_takes_its_layout_from_the_cluster_config(tmp_path,
                                                                                ray_session):
    from cerebras.pytorch.distributed import ClusterConfig

    cpu_events, *_ = _trainer_style_run(tmp_path / "cpu", "CPU")
    events, callbacks, received, kept = _trainer_style_run(
        tmp_path / "csx", "CSX", in_process=True,
        cluster_config=ClusterConfig(num_csx=1, num_workers_per_csx=1, job_labels=["team=a"]))
    # the same losses and checkpoints as on CPU (one process, one thread count: exact)
    assert events == cpu_events
    assert kept == ["checkpoint_4.mdl", "checkpoint_6.mdl"]
    assert len(received) == 6 and all(name.endswith(".output0") for name in received)


def test_a_csx_backend_keeps_its_cluster_config_and_lists_what_has_no_effect(tmp_path,
                                                                            ray_session):
    from cerebras.pytorch.distributed import ClusterConfig

    config = ClusterConfig(num_csx=2, num_workers_per_csx=3, job_labels=["team=a"])
    backend = cstorch.backend("CSX", in_process=True, cluster_config=config,
                              artifact_dir=str(tmp_path))
    try:
        assert cstorch.backend() is backend and backend.cluster.config is config
        assert backend.accepted_without_effect["cluster_config.job_labels"] == ["team=a"]
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(_trainer_input_fn), num_steps=1)
        assert (executor.cs_config.num_csx, executor.cs_config.num_workers_per_csx) == (2, 3)
    finally:
        backend.shutdown()


def test_the_210_trainer_calls_on_the_backend_executor_and_a_traced_method(tmp_path):
    with pytest.raises(RuntimeError, match="No backend has been created"):
        cstorch.current_backend(raise_exception=True, raise_warning=False)
    backend = cstorch.backend("CPU", str(tmp_path))  # artifact_dir by position
    try:
        assert (cstorch.backend() is backend, backend.artifact_dir, backend.is_e2e_execution,
                backend.torch_device, backend.is_tracing) == (
            True, tmp_path.resolve(), True, torch.device("cpu"), False)

        class Trainer:
            def __init__(self):
                self.seen = []

            @cstorch.trace
            def training_step(self, batch):
                self.seen.append(cstorch.current_backend().is_tracing)
                return batch["x"].sum()

        trainer = Trainer()
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(_trainer_input_fn), num_steps=2)
        with pytest.raises(RuntimeError, match="must be iterated before having an artifact"):
            executor.artifact_dir
        sums = [float(trainer.training_step(batch)) for batch in executor]
        assert trainer.training_step is trainer.training_step  # bound once per object
        expected = [float(b["x"].sum()) for b in _trainer_input_fn()[:2]]
        assert (sums, trainer.seen, backend.is_tracing) == (expected, [True, True], False)
        assert executor.artifact_dir.parent == tmp_path.resolve() / "executors"
    finally:
        backend.shutdown()
