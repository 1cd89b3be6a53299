"""The Cerebras names that Model Zoo programs use, in the shapes their flows use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
import cstream
from workers.context import WorkerInfo, streamer_context, worker_context


# -- names in every process -----------------------------------------------------------------------
def test_both_spellings_are_cstream_modules_not_copies():
    import cerebras.appliance.errors as e1
    import cerebras_appliance.errors as e2
    import cerebras_pytorch
    from cerebras.pytorch.core import modes
    from cerebras_pytorch.utils.nest import visit_torch_tensors

    assert cstorch is cstream and cerebras_pytorch is cstream
    assert cstorch.optim.Adam is cstream.optim.Adam
    assert e1.ApplianceNanError is e2.ApplianceNanError
    assert (modes.TRAIN, modes.EVAL, modes.TRAIN_AND_EVAL, modes.EVAL_ALL) == (
        "train", "eval", "train_and_eval", "eval_all")
    assert visit_torch_tensors is cstream.utils.nest.visit_torch_tensors


class _WhoAmI(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        import cerebras.pytorch.distributed as dist  # imported in the DataLoader worker process

        return torch.tensor([int(dist.is_streamer()), dist.get_streaming_rank(),
                             dist.num_streamers(), dist.get_streaming_batch_size(5),
                             int(os.environ.get("CSTREAM_NAMES_TEST", "-1")), os.getpid()])


def who_am_i_input_fn():
    return torch.utils.data.DataLoader(_WhoAmI(), batch_size=1, num_workers=1)


@pytest.mark.timeout(600)
def test_a_dataloader_worker_process_of_a_ray_input_worker_sees_the_names_and_the_environ(
        ray_session):
    from cerebras.appliance.environment import appliance_environ
    from workers.config import CSConfig
    from workers.dataloader import DataLoader
    from workers.flow import FlowPolicy
    from workers.stream import CsxInputStream

    appliance_environ["CSTREAM_NAMES_TEST"] = "7"
    try:
        cfg = CSConfig(num_csx=2, num_workers_per_csx=1)
        stream = CsxInputStream(DataLoader(who_am_i_input_fn), cfg, 1,
                                policy=FlowPolicy.from_config(cfg), name_prefix="names")
        try:
            rows = [stream.next()[0][0].tolist() for _ in range(2)]
        finally:
            stream.close()
    finally:
        del appliance_environ["CSTREAM_NAMES_TEST"]
    # streamer, global rank 1 of 2 (CS-X 1's only worker), CS-X 1's slice of 5 is 2, environ
    assert [r[:5] for r in rows] == [[1, 1, 2, 2, 7]] * 2
    assert rows[0][5] not in (os.getpid(),)  # computed in another process
    assert "CSTREAM_NAMES_TEST" not in os.environ


def test_the_client_is_the_master_and_streams_nothing():
    import cerebras.pytorch.distributed as dist

    assert (dist.is_streamer(), dist.num_streamers(), dist.get_ordinal(), dist.num_tasks(),
            dist.is_master_ordinal(), dist.get_streaming_batch_size(10)) == (
        False, 0, 0, 1, True, 10)
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)  # no torch.distributed group
    with pytest.raises(RuntimeError, match="does not stream inputs.*is_streamer"):
        dist.get_streaming_rank()


def test_inside_a_worker_the_tasks_are_the_input_workers_in_global_order():
    import cerebras.pytorch.distributed as dist
    from cerebras.pytorch.distributed.cluster_resolver import ClusterSpec, TaskSpec

    info = WorkerInfo(local_worker_id=1, num_workers_per_csx=2, num_csx=3, wse_id=2)
    with worker_context(info), streamer_context():
        spec = dist.service_resolver().cluster_spec
        assert isinstance(spec, ClusterSpec) and isinstance(spec.task(), TaskSpec)
        assert [(t.rank, t.local_rank, t.wse_id) for t in spec.tasks] == [
            (0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1), (4, 0, 2), (5, 1, 2)]
        assert (dist.get_streaming_rank(), dist.num_streamers(), dist.num_tasks(),
                dist.is_master_ordinal()) == (5, 6, 6, False)
        # 10 samples over 3 CS-Xs: 4, 3, 3
        assert [dist.get_streaming_batch_size(10, r) for r in (0, 2, 4)] == [4, 3, 3]
        assert dist.get_worker_state().wse_id == 2
        assert cstorch.use_cs()  # input workers exist only for CSX runs
    assert not cstorch.use_cs()


def _run_python(code: str, pythonpath: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    return subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env=env, timeout=300)


def _fake_cerebras(tmp_path):
    fake = tmp_path / "site"
    (fake / "cerebras" / "pytorch").mkdir(parents=True)
    (fake / "cerebras" / "pytorch" / "__init__.py").write_text("WHO = 'the real one'\n")
    return fake


def test_a_real_cerebras_package_behind_cstream_is_named_in_a_warning(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(cstream.__file__)))
    fake = _fake_cerebras(tmp_path)
    r = _run_python("import cerebras.pytorch as c; print(c.__name__)", [root, str(fake)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "cstream"
    assert "CerebrasPackageWarning" in r.stderr
    assert f"also installed at {fake / 'cerebras' / 'pytorch'}" in r.stderr


def test_cstream_says_when_cerebras_pytorch_is_the_real_package(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(cstream.__file__)))
    fake = _fake_cerebras(tmp_path)
    r = _run_python("import cstream, cerebras.pytorch as c; print(c.WHO)", [str(fake), root])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "the real one"
    assert f"cerebras.pytorch is the Cerebras package at {fake / 'cerebras' / 'pytorch'}" in r.stderr


# -- the appliance client's modules ---------------------------------------------------------------
def test_debug_args_are_recorded_written_and_read_back(tmp_path):
    from cerebras.appliance.run_utils import (DebugArgs, get_debug_args, set_default_ini,
                                              set_ini, update_debug_args_from_keys,
                                              write_debug_args)

    d = DebugArgs()
    d.debug_usr.worker_resource.memory_bytes = 3 << 30  # update_debug_args_with_mem_limits
    set_default_ini(d, ws_opt_speed=True, other=1)
    set_default_ini(d, ws_opt_speed=False)  # a default never overwrites
    set_ini(d, other=2)
    update_debug_args_from_keys(d, {"debug_crd.retry": 3, "debug_usr": {"x": "y"}})
    path = tmp_path / "m" / ".debug_args.proto"
    write_debug_args(d, str(path))
    back = get_debug_args(str(path))
    assert back == d
    assert back.to_dict() == {
        "debug_usr": {"worker_resource": {"memory_bytes": 3 << 30}, "x": "y"},
        "ini": {"ws_opt_speed": True, "other": 2}, "debug_crd": {"retry": 3}}
    cfg = cstorch.utils.CSConfig(debug_args=d)
    assert cfg.to_dict()["debug_args"] == d.to_dict()
    with pytest.raises(FileNotFoundError, match="debug_args_path .* does not exist"):
        get_debug_args(str(tmp_path / "none"))


def test_appliance_log_units_file_and_errors(tmp_path):
    import logging

    from cerebras.appliance.errors import ApplianceClientException, ApplianceNanError
    from cerebras.appliance.log import collect_wsc_log_settings, get_level_name, wsc_logger
    from cerebras.appliance.utils.file import create_symlink
    from cerebras.appliance.utils.units import convert_byte_unit

    assert issubclass(ApplianceNanError, ApplianceClientException)
    assert (get_level_name("verbose"), get_level_name(5), get_level_name("info")) == (
        15, "TRACE", logging.INFO)
    try:
        wsc_logger.getChild("wrk").setLevel(logging.DEBUG)
        settings = collect_wsc_log_settings()
        assert [(s.level, s.role) for s in settings] == [(logging.DEBUG, "wrk")]
    finally:
        wsc_logger.getChild("wrk").setLevel(logging.NOTSET)
    assert convert_byte_unit(2, "B", src_unit="GiB") == 2 << 30
    assert convert_byte_unit(1500, "KB", precision=1) == 1.5
    with pytest.raises(ValueError, match="tgt_unit 'XB'"):
        convert_byte_unit(1, "XB")
    (tmp_path / "a").mkdir()
    create_symlink(tmp_path / "latest", tmp_path / "a")
    create_symlink(tmp_path / "latest", tmp_path / "a")  # replaced, not an error
    assert os.readlink(tmp_path / "latest") == str(tmp_path / "a")


# -- the flow's calls ----------------------------------------------------------------------------
def test_csconfig_takes_the_cluster_keywords_the_flow_passes():
    runconfig = {"disable_version_check": True}
    cfg = cstorch.utils.CSConfig(
        num_csx=runconfig.get("num_csx"), max_wgt_servers=runconfig.get("num_wgt_servers"),
        mgmt_address=None, mgmt_namespace=None, credentials_path=None, debug_args=None,
        mount_dirs=["/data"], python_paths=None, transfer_processes=None,
        num_workers_per_csx=0, job_labels=["a=b"], max_act_per_csx=None, job_priority=None,
        job_time_sec=None, disable_version_check=runconfig["disable_version_check"],
        fabric_type_blacklist=None)
    cfg.precision_opt_level = 1
    assert (cfg.num_csx, cfg.num_workers_per_csx, cfg.autoscaling) == (1, 1, True)
    d = cfg.to_dict()
    assert (d["mount_dirs"], d["job_labels"], d["disable_version_check"],
            d["precision_opt_level"]) == (["/data"], ["a=b"], True, 1)
    assert json.loads(json.dumps(d)) == d


def test_backend_options_of_the_flow_are_accepted_and_recorded():
    b = cstorch.backend("CPU", mixed_precision=False, artifact_dir="logs")
    try:
        assert (b.is_cpu, b.is_csx, b.is_gpu, b.backend_type.name) == (True, False, False, "CPU")
        assert b.accepted_without_effect == {} and b.mixed_precision is False
        assert not cstorch.use_cs()
        b.device.config.lazy_initialization = False
        assert b.accepted_without_effect["device.config.lazy_initialization"] is False
        assert b.device.config.drop_data is False
        with pytest.raises(AttributeError, match="no setting 'speed'"):
            b.device.config.speed = 1
        from cerebras.pytorch.backend import current_backend_impl

        assert current_backend_impl() is b
    finally:
        b.shutdown()
    with pytest.raises(TypeError, match="unknown option 'use_cs_grad_accum'"):
        cstorch.backend("CPU", use_cs_grad_accum=True)


def test_compute_num_steps_follows_epochs_steps_and_max_steps():
    loader = list(range(10))
    f = cstorch.utils.data.compute_num_steps
    assert f(loader, num_epochs=3) == 30
    assert f(loader, num_epochs=3, grad_accum_steps=3) == 9
    assert f(loader, num_steps=7, max_steps=12, initial_step=8) == 4
    assert f(loader, num_epochs=2, steps_per_epoch=4) == 8
    with pytest.raises(ValueError, match="One of num_epochs, num_steps, or max_steps"):
        f(loader)
    with pytest.raises(RuntimeError, match="Initial global step 5 already exceeds max step 5"):
        f(loader, max_steps=5, initial_step=5)
    with pytest.raises(ValueError, match="Only one of `num_epochs` or `num_steps`"):
        f(loader, num_steps=1, num_epochs=1)


def _fc_input_fn():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=g)
    y = (x.sum(1) > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6)


def test_a_cpu_run_in_the_flow_shape_writes_summaries_at_base_step_and_counts_samples(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cstorch.manual_seed(1)
    backend = cstorch.backend("CPU", mixed_precision=False, artifact_dir=str(tmp_path / "a"))
    try:
        with backend.device:
            model = torch.nn.Linear(4, 2)
        compiled = cstorch.compile(model, backend)
        groups = cstorch.optim.configure_param_groups(model, {"weight_decay": 0.01})
        assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
        opt = cstorch.optim.configure_optimizer("SGD", [{"params": g["params"]} for g in groups],
                                                lr=0.1)
        loader = cstorch.utils.data.DataLoader(_fc_input_fn)
        assert loader.is_restartable and loader.batch_size is None
        writer = cstorch.utils.tensorboard.SummaryWriter(log_dir=str(tmp_path / "tb"),
                                                         base_step=11)

        @cstorch.trace
        def step(batch):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            cstorch.summarize_scalar("loss_s", loss)
            return loss

        num_steps = cstorch.utils.data.compute_num_steps(loader, num_epochs=1)
        executor = cstorch.utils.data.DataExecutor(
            loader, num_steps=num_steps, checkpoint_steps=None, activation_steps=1,
            cs_config=cstorch.utils.CSConfig(num_csx=None, num_workers_per_csx=0),
            writer=writer, listeners=[], micro_batch_size="auto")
        for batch in executor:
            step(batch)
        writer.close()
        assert (executor.profiler.total_samples(), num_steps) == (24, 4)
        assert executor.profiler.total_time() > 0
        tracker = executor.profiler.rate_tracker  # the Release 2.2 spelling
        assert tracker.total_samples == 24 and tracker.total_time > 0
        assert tracker.global_rate >= 0 and tracker.rate >= 0
        assert loader.batch_size == 6
    finally:
        backend.shutdown()
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert [e.step for e in events.Scalars("loss_s")] == [11, 12, 13, 14]
    profile = json.loads(next((tmp_path / "a").rglob("profile.json")).read_text())
    assert profile["accepted_without_effect"] == {
        "activation_steps": 1, "micro_batch_size": "auto"}


# -- the helpers models call ---------------------------------------------------------------------
def test_nest_visits_and_recurse_spec_give_the_scopes_in_flatten_order():
    from torch.utils._pytree import tree_flatten

    from cerebras.pytorch.utils.nest import recurse_spec, visit_torch_tensors

    batch = {"a": torch.zeros(1), "b": (torch.ones(2), {"c": torch.ones(3)}), "n": 4}
    assert [(s, t.numel()) for s, t in visit_torch_tensors(batch)] == [
        (["a"], 1), (["b", "0"], 2), (["b", "1", "c"], 3)]
    with pytest.raises(ValueError, match="Unknown data structure at n"):
        list(visit_torch_tensors(batch, strict=True))
    leaves, spec = tree_flatten(batch)
    assert list(recurse_spec(spec)) == [["a"], ["b", "0"], ["b", "1", "c"], ["n"]]


def test_numpy_round_trip_constants_seed_and_debug_names():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    a.flags.writeable = False
    t = cstorch.from_numpy(a)
    assert t.tolist() == a.tolist() and cstorch.from_numpy(t) is t
    assert cstorch.to_numpy(torch.ones(2, dtype=torch.bfloat16)).tolist() == [1.0, 1.0]
    c = torch.ones(2)
    assert cstorch.make_constant(c) is c
    cstorch.manual_seed(3)
    first = torch.rand(2)
    cstorch.manual_seed(3)
    assert torch.equal(first, torch.rand(2))
    m = torch.nn.Sequential(torch.nn.Linear(1, 1))
    cstorch.add_debug_name(m, "net")
    assert (cstorch.get_debug_name(m), cstorch.get_debug_name(m[0])) == ("net", "net.0")
    with cstorch.name_scope("outer"), cstorch.name_scope("inner"):
        from cstream.core.name_scope import current_scope

        assert current_scope() == "outer.inner"


def test_nn_modules_compute_what_the_models_expect():
    x = torch.arange(6.0).reshape(1, 3, 2)
    mask = torch.tensor([[1, 1, 0]])
    assert cstorch.nn.StripPadding()(x, mask).tolist() == [[[0, 1], [2, 3], [0, 0]]]
    s = cstorch.nn.Scope("attn")
    assert s(x) is x and s.exit(x) is x
    assert cstorch.nn.functional.one_hot(torch.tensor([1]), 3).tolist() == [[0, 1, 0]]
    # perfect 3D prediction, both classes present: Dice 1, cross entropy ~0
    labels = torch.tensor([[[[0, 1]]]])  # [N, D, H, W]
    logits = torch.stack([(labels == 0).float(), (labels == 1).float()], 1) * 40 - 20
    loss = cstorch.nn.DiceCELoss(num_classes=2, include_background=False)
    assert float(loss(logits, labels, list(logits.shape))) == pytest.approx(0.0, abs=1e-5)
    wrong = cstorch.nn.DiceCELoss(num_classes=2, include_background=True)(-logits, labels,
                                                                          list(logits.shape))
    assert float(wrong) == pytest.approx(0.5 * 40 + 0.5 * 1.0, rel=1e-3)


def test_rate_tracker_and_synthetic_dataset():
    from cerebras.pytorch.utils.tracker import RateTracker

    t = RateTracker()
    t.add(5)
    assert t.rate() >= 0 and t.total_count == 5.0
    t.add(3)
    assert t.total_count == 8.0
    ds = cstorch.utils.data.SyntheticDataset(
        {"x": torch.zeros(2), "i": lambda i: torch.tensor(i)}, num_samples=2)
    assert [int(s["i"]) for s in ds] == [0, 1] and len(ds) == 2
    with pytest.raises(TypeError, match="does not have a length"):
        len(cstorch.utils.data.SyntheticDataset(torch.zeros(1)))


def test_annotations_that_change_nothing_run_the_function_unchanged():
    from cerebras.pytorch.utils.kernel import kernel_annotater

    assert kernel_annotater(None)(abs)(-2) == 2
    assert kernel_annotater("FAST_ATTENTION")(abs)(-2) == 2
    assert cstorch.pol(bwd_level=0)(abs)(-2) == 2
    with pytest.raises(ValueError, match="level is 0, 1 or 2"):
        cstorch.pol(level=5)
    assert cstorch.amp.set_half_dtype("bfloat16") is torch.bfloat16
    cstorch.amp.set_half_dtype(torch.float16)
    with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=-1,
                                                                     end_step=-1)) as prof:
        pass
    assert prof.op_profiler_json is None


@pytest.mark.parametrize("call,feature", [
    (lambda: cstorch.sparse.configure({"sparsity": 0.5}), "weight sparsity"),
    (lambda: cstorch.sparse.SparsityWrapperOptimizer(None), "weight sparsity"),
    (lambda: cstorch.experimental.listener.create_listener(listener_type="x"),
     "tensor listeners"),
    (lambda: cstorch.experimental.run_implicit_autoregressive_loop(None),
     "autoregressive generation loop"),
    (lambda: cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=1,
                                                                        end_step=2)),
     "per-op profiling of steps 1-2"),
])
def test_features_not_simulated_raise_an_error_naming_the_feature_and_the_page(call, feature):
    from cstream.unsupported import UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match=f"{feature}.*docs/modelzoo.md"):
        call()


class _OptimizerSection:
    """An ``optimizer:`` section checked as a Release 2.2 config class checks it: the known fields
    become attributes, every other key is collapsed into ``optim_params``, each scheduler dict is
    checked on its own, then the optimizer with the rate and ``optim_params`` only."""

    FIELDS = ("optimizer_type", "weight_decay", "log_summaries", "loss_scaling_factor",
              "learning_rate", "max_gradient_norm", "adjust_learning_rate")

    def __init__(self, **section):
        self.fields = {k: section.pop(k) for k in self.FIELDS if k in section}
        self.optim_params = section
        rate = self.fields.get("learning_rate")
        for spec in rate if isinstance(rate, list) else [rate] if isinstance(rate, dict) else []:
            spec = {k: v for k, v in spec.items() if k != "main_scheduler"}
            cstorch.optim.configure_scheduler_params(spec)
        self.optimizer = cstorch.optim.configure_optimizer_params(
            optimizer_type=self.fields["optimizer_type"],
            kwargs={"learning_rate": rate, "optim_params": self.optim_params})


def test_an_optimizer_section_passes_a_config_class_validation(caplog):
    section = {"optimizer_type": "adamw", "betas": [0.9, 0.95], "eps": 1.0e-8,
               "max_gradient_norm": 1.0, "weight_decay": 0.01, "loss_scaling_factor": "dynamic",
               "learning_rate": [
                   {"scheduler": "Linear", "initial_learning_rate": 0.0,
                    "end_learning_rate": 0.0006, "total_iters": 1600},
                   {"scheduler": "Linear", "initial_learning_rate": 0.0006,
                    "end_learning_rate": 0.0, "total_iters": 150000}]}
    with caplog.at_level("WARNING", logger="cstream.optim"):
        checked = _OptimizerSection(**section)
    cls, kwargs = checked.optimizer
    # a scheduled rate: AdamW's default lr stands in until the scheduler sets it
    assert cls is cstorch.optim.AdamW and kwargs == {"lr": 1e-3}
    [record] = caplog.records
    assert "AdamW got 1 unexpected and unused parameters: ['optim_params']" in record.message
    assert "lr: float = 0.001" in record.message


def test_optimizer_params_map_the_rate_take_the_signature_and_warn_about_the_rest(caplog):
    given = {"learning_rate": 0.02, "betas": (0.8, 0.9), "correct_bias": False,
             "max_gradient_norm": 1.0}
    with caplog.at_level("WARNING", logger="cstream.optim"):
        cls, kwargs = cstorch.optim.configure_optimizer_params("AdamW", given)
    assert cls is cstorch.optim.AdamW
    assert kwargs == {"lr": 0.02, "betas": (0.8, 0.9), "correct_bias": False}
    assert "learning_rate" in given  # the caller's dict is left as it was
    assert "got 1 unexpected and unused parameters: ['max_gradient_norm']" in caplog.text
    assert cstorch.optim.configure_optimizer_params("sgd", {})[1] == {"lr": 0.1}  # no default
    with pytest.raises(ValueError, match="expected: betas, actual: beta1, beta2"):
        cstorch.optim.configure_optimizer_params("adam", {"beta1": 0.9, "beta2": 0.99})
    with pytest.raises(ValueError, match="Invalid optimizer type.*'adamw'.*Got: Adamm"):
        cstorch.optim.configure_optimizer_params("Adamm", {})


def test_scheduler_params_name_the_class_and_refuse_unknown_arguments():
    spec = {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.1,
            "total_iters": 10}
    cls, kwargs = cstorch.optim.configure_scheduler_params(spec)
    assert cls is cstorch.optim.lr_scheduler.LinearLR and "scheduler" in spec
    assert kwargs == {"initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 10}
    assert cstorch.optim.configure_scheduler_params(0.1) is None
    with pytest.raises(ValueError, match="unknown scheduler 'Wobbly'"):
        cstorch.optim.configure_scheduler_params([{"scheduler": "Wobbly"}])
    with pytest.raises(ValueError, match="expected: total_iters, actual: decay_steps"):
        cstorch.optim.configure_scheduler_params(
            {"scheduler": "LinearLR", "initial_learning_rate": 0.0, "decay_steps": 5})
    with pytest.raises(ValueError, match=r"LinearLR got 1 unexpected parameters: \['power'\]"):
        cstorch.optim.configure_scheduler_params({**spec, "power": 2.0})


def test_no_deprecation_or_other_warning_on_import():
    root = os.path.dirname(os.path.dirname(os.path.abspath(cstream.__file__)))
    r = _run_python("import cerebras.pytorch, cerebras_appliance.run_utils", [root])
    assert r.returncode == 0 and "Warning" not in r.stderr, r.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import cerebras.appliance.environment  # noqa: F401


def test_the_worker_cache_is_a_named_error_where_the_cluster_disk_is_absent(tmp_path):
    import cerebras.pytorch.distributed as dist

    if os.path.isdir(dist.WORKER_CACHE_ROOT):
        pytest.skip(f"{dist.WORKER_CACHE_ROOT} exists on this machine")
    with pytest.raises(FileNotFoundError, match="use_worker_cache: False"):
        dist.hit_worker_cache_limit(str(tmp_path), dist.WORKER_CACHE_ROOT + "/x")


def test_the_saver_is_an_attribute_of_the_package_in_a_fresh_interpreter():
    """Release 2.1's flow reads ``cstorch.saver.PyTorchH5Saver.extract_version`` after only
    ``import cerebras_pytorch as cstorch``: the subpackage must be bound without its own import."""
    code = ("import cerebras_pytorch as cstorch; "
            "print(cstorch.saver.PyTorchH5Saver.extract_version.__qualname__)")
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "PyTorchH5Saver.extract_version"


def test_the_2_0_saver_class_reads_and_writes_cstream_checkpoints(tmp_path):
    from cerebras.pytorch.saver import PyTorchH5Saver
    from cerebras.pytorch.saver.pt_h5_saver import PyTorchH5Saver as same

    assert same is PyTorchH5Saver
    path = str(tmp_path / "c.h5")
    weight = torch.arange(6.0).reshape(2, 3)
    saver = PyTorchH5Saver()
    saver.save(path, {"model": {"fc.weight": weight}, "state": [torch.ones(2)], "step": 3})
    assert PyTorchH5Saver.is_valid_checkpoint(path)
    assert not PyTorchH5Saver.is_valid_checkpoint(str(tmp_path / "missing.h5"))
    version = PyTorchH5Saver.extract_version(path)
    assert version.ckpt_version == 0.5 and version.written_by.startswith("cstream ")
    assert saver.tensor_names(path) == ["model.fc.weight", "state.0"]
    assert torch.equal(saver.load_tensor(path, "model.fc.weight"), weight)
    assert [n for n, _ in saver.flatten_state_dict({"a": {"b": 1}, "c": [2]})] == ["a.b", "c.0"]
    with pytest.raises(KeyError, match="no tensor named 'model.bias'"):
        saver.load_tensor(path, "model.bias")
