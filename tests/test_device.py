"""Every cstream object follows the backend's device, checked without a GPU.

The eager backends are one class, :class:`executor.backends.cpu.EagerBackend`, on a torch
device: ``cstream.backend("CPU")`` is it on ``cpu``, ``cstream.backend("GPU")`` on
``cuda:N``. Here it runs on ``meta`` (tensors with shapes and dtypes but no values, which every
torch build has), so a state tensor that stays on the CPU shows up as a CPU tensor where a
``meta`` one is expected -- the same fault as "Expected all tensors to be on the same device,
cuda:0 and cpu" on a GPU. tests/test_device_cuda.py runs the same objects on a real GPU and
compares their values with the CPU backend's.
"""

from __future__ import annotations

import pytest
import torch

import cstream as cstorch
from executor.backends.cpu import EagerBackend, _to_device
from executor.backends.options import CPUOptions
from workers.torch_compat import TorchDispatchMode, torch_function_mode_depth, tree_leaves

META = torch.device("meta")


def metric_cases(device) -> dict:
    """All ten metrics of cstream.metrics, each with one batch of inputs on ``device``:
    ``name -> (factory, kwargs of update)``."""
    m = cstorch.metrics

    def t(values, dtype=None):
        return torch.tensor(values, dtype=dtype).to(device)

    labels, predictions = t([0, 1, 2, 1, 2, 0]), t([0, 2, 2, 1, 1, 0])
    return {
        "AccuracyMetric": (lambda: m.AccuracyMetric("acc"),
                           dict(labels=labels, predictions=predictions)),
        "MeanMetric": (lambda: m.MeanMetric("mean"), dict(value=t([1.0, 2.0, 4.5]))),
        "PerplexityMetric": (lambda: m.PerplexityMetric("ppl"),
                             dict(labels=t([[1, 2, 3], [4, 0, 1]]), loss=t(5.25))),
        "FBetaScoreMetric": (lambda: m.FBetaScoreMetric(3, beta=0.5, name="fbeta"),
                             dict(labels=labels, predictions=predictions)),
        "MeanIOUMetric": (lambda: m.MeanIOUMetric(3, name="miou"),
                          dict(labels=labels, predictions=predictions)),
        "DiceCoefficientMetric": (lambda: m.DiceCoefficientMetric(3, name="dice"),
                                  dict(labels=labels, predictions=predictions)),
        "MeanPerClassAccuracyMetric": (lambda: m.MeanPerClassAccuracyMetric(3, name="mpca"),
                                       dict(labels=labels, predictions=predictions)),
        "PrecisionAtKMetric": (lambda: m.PrecisionAtKMetric(2, name="p@2"),
                               dict(labels=t([[0, 3], [1, 2]]),
                                    predictions=t([[0.9, 0.8, 0.1, 0.2], [0.1, 0.2, 0.9, 0.3]]))),
        "RecallAtKMetric": (lambda: m.RecallAtKMetric(2, name="r@2"),
                            dict(labels=t([[0, 3], [1, 2]]),
                                 predictions=t([[0.9, 0.8, 0.1, 0.2], [0.1, 0.2, 0.9, 0.3]]))),
        "AUCMetric": (lambda: m.AUCMetric(num_thresholds=20, name="auc"),
                      dict(labels=t([0, 0, 1, 1, 1]), predictions=t([0.1, 0.6, 0.4, 0.9, 0.7]))),
    }


def test_the_ten_metrics_are_covered():
    exported = {n for n in cstorch.metrics.__all__ if n.endswith("Metric") and n != "Metric"}
    assert sorted(metric_cases("cpu")) == sorted(exported)
    assert len(exported) == 10


@pytest.fixture
def meta_backend(tmp_path):
    backend = EagerBackend(CPUOptions(artifact_dir=tmp_path / "run"), torch_device="meta")
    yield backend
    backend.shutdown()


def devices(tensors) -> set:
    return {str(t.device) for t in tensors}


@pytest.mark.parametrize("name", sorted(metric_cases("cpu")))
def test_a_metric_built_under_a_backend_keeps_its_state_on_the_backend_device(name, meta_backend):
    factory, inputs = metric_cases(META)[name]
    metric = factory()
    assert devices(metric.buffers()) == {"meta"}, "state created on another device"
    metric(**inputs)
    metric(**inputs)
    assert devices(metric.buffers()) == {"meta"}


@pytest.mark.parametrize("name", sorted(metric_cases("cpu")))
def test_a_metric_built_on_the_cpu_moves_its_state_to_the_device_of_its_inputs(name):
    factory, inputs = metric_cases(META)[name]
    metric = factory()  # no backend: the CPU
    assert devices(metric.buffers()) == {"cpu"}
    metric(**inputs)
    assert devices(metric.buffers()) == {"meta"}


@pytest.mark.parametrize("name", sorted(metric_cases("cpu")))
def test_a_metric_fed_cpu_inputs_stays_on_the_cpu_and_counts_the_same(name):
    factory, inputs = metric_cases("cpu")[name]
    a, b = factory(), factory()
    a(**inputs)
    a(**inputs)
    b(**inputs)
    b(**inputs)
    assert devices(a.buffers()) == {"cpu"} and a.num_updates == 2
    assert float(a) == float(b)


def test_a_metric_fed_inputs_on_two_devices_is_left_where_it_is_and_torch_says_why():
    metric = cstorch.metrics.AccuracyMetric("acc")
    with pytest.raises((RuntimeError, NotImplementedError)):
        metric(labels=torch.tensor([1, 2]), predictions=torch.tensor([1, 2], device="meta"))
    assert devices(metric.buffers()) == {"cpu"}


def test_the_loss_scaler_and_optimizer_state_are_created_on_the_backend_device(meta_backend):
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    assert devices(scaler.state_dict().values()) == {"meta"}
    static = cstorch.amp.GradScaler(loss_scale=128.0)
    assert devices([static.get_num_skipped_steps(), scaler.get_num_skipped_steps()]) == {"meta"}
    with meta_backend.device:
        model = torch.nn.Linear(3, 2)
    cstorch.compile(model, meta_backend)
    opt = cstorch.optim.Adam(model.parameters(), lr=0.1)
    opt.ensure_preinitialized()
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert state and devices(state) == {"meta"}
    assert devices(opt.lr_tensor(g) for g in opt.param_groups) == {"meta"}  # what a scheduler uses


def test_optimizer_state_made_before_compile_follows_the_model_to_the_device(meta_backend):
    model = torch.nn.Linear(3, 2)  # on the CPU: built outside `with backend.device:`
    opt = cstorch.optim.Adam(model.parameters(), lr=0.1)
    opt.ensure_preinitialized()  # as loading a checkpoint into it would
    # zeros_like(p) on the CPU (the scalar counters are made on the backend's device)
    assert "cpu" in devices(v for s in opt.state.values() for v in s.values())
    cstorch.compile(model, meta_backend)
    assert devices(model.parameters()) == {"meta"}
    assert devices(v for s in opt.state.values() for v in s.values()) == {"meta"}


def _scheduler_cases():
    from reference.gen_sched import CASES, build, make_optimizer

    return CASES, build, make_optimizer


@pytest.mark.parametrize("name", sorted(_scheduler_cases()[0]))
def test_every_scheduler_keeps_its_state_and_its_rates_on_the_backend_device(name, meta_backend):
    cases, build, make_optimizer = _scheduler_cases()
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, cases[name])
    for _ in range(3):
        sched.step()
    held = [sched.last_epoch, *(v for v in sched._last_value if v is not None)]
    assert devices(held) == {"meta"}
    targeted = [g for g, v in zip(opt.param_groups, sched._last_value) if v is not None]
    assert targeted and devices(g[sched.param_group_key] for g in targeted) == {"meta"}


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                        torch.nn.ReLU(), torch.nn.Dropout(0.25))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))


def _input_fn():
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)
    return [(xs[i:i + 8], ys[i:i + 8]) for i in range(0, 32, 8)]


def test_a_training_loop_keeps_every_tensor_on_the_backend_device(meta_backend):
    """The loop of examples/train.py and evaluate.py (compile, optimizer, scheduler, dynamic
    loss scaling with clipping, a metric), on the eager backend's device: every batch, state
    tensor and output is there, none on the CPU."""
    with meta_backend.device:
        model = _Net()
    compiled = cstorch.compile(model, meta_backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = cstorch.optim.lr_scheduler.LinearLR(opt, 0.1, 0.01, 10)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    accuracy = cstorch.metrics.AccuracyMetric("acc")
    seen = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        seen.extend([x, y])
        out = compiled(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        cstorch.amp.optimizer_step(loss, opt, scaler, max_gradient_norm=1.0)
        sched.step()
        accuracy(labels=y, predictions=out.argmax(-1))
        return loss

    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(_input_fn),
                                               num_steps=4)
    losses = [step(batch) for batch in executor]
    assert len(seen) == 8 and devices(seen) == {"meta"}
    assert devices(losses) == {"meta"}
    assert devices(model.parameters()) == {"meta"} and devices(model.buffers()) == {"meta"}
    opt_state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert opt_state and devices(opt_state) == {"meta"}
    assert devices([sched.last_epoch, *scaler.state_dict().values(),
                    *accuracy.buffers()]) == {"meta"}


def test_step_closures_off_the_cpu_get_the_device_tensors_on_the_cpu():
    """The GPU backend's closures get CPU tensors (as the real package's GPU backend gives
    them); tensors already elsewhere, and other values, pass unchanged."""
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    obj = {"x": torch.ones(2, device="meta"), "p": Pair(torch.ones(1, device="meta"), 3),
           "c": [torch.zeros(1)]}
    moved = _to_device(obj, "meta", only_from=torch.device("cpu"))
    assert isinstance(moved["p"], Pair) and moved["p"].b == 3
    assert devices([moved["x"], moved["p"].a, moved["c"][0]]) == {"meta"}
    kept = _to_device(obj, "cpu", only_from=torch.device("cuda", 0))
    assert kept["x"] is obj["x"] and kept["c"][0] is obj["c"][0]


def test_an_eager_backend_refuses_a_random_state_from_another_kind_of_generator(tmp_path):
    backend = cstorch.backend("CPU", artifact_dir=tmp_path)
    cuda_like = torch.zeros(16, dtype=torch.uint8)  # a CUDA (Philox) generator keeps 16 bytes
    cpu_size = torch.get_rng_state().numel()
    with pytest.raises(ValueError, match=(
            f"the state has 16 bytes, but the CPU generator of the CPU backend keeps {cpu_size}: "
            "it was saved from another device's generator")):
        cstorch.set_rng_state(cuda_like)
    state = cstorch.get_rng_state()
    a = torch.rand(3)
    cstorch.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))
    backend.shutdown()


def test_manual_seed_under_an_eager_backend_seeds_the_step_stream(tmp_path):
    cstorch.backend("CPU", artifact_dir=tmp_path)
    cstorch.manual_seed(7)
    a = torch.nn.functional.dropout(torch.ones(64), 0.5)
    cstorch.manual_seed(7)
    assert torch.equal(a, torch.nn.functional.dropout(torch.ones(64), 0.5))


def test_a_checkpoint_loads_onto_the_device_map_location_names(tmp_path):
    path = tmp_path / "ckpt.h5"
    cstorch.save({"w": torch.arange(4.0), "nested": [torch.ones(2)], "step": 3}, path)
    onto_meta = cstorch.load(path, map_location="meta")
    assert devices([onto_meta["w"], onto_meta["nested"][0]]) == {"meta"}
    # a GPU-saved checkpoint loaded with torch's {saved: new} form: cstream files hold CPU
    # values, so the "cpu" entry decides and any other entry changes nothing
    assert torch.equal(cstorch.load(path, map_location={"cuda:0": "cpu"})["w"], torch.arange(4.0))
    assert devices([cstorch.load(path, map_location={"cpu": "meta"})["w"]]) == {"meta"}
    called = cstorch.load(path, map_location=lambda t, loc: t.to("meta") if loc == "cpu" else None)
    assert devices([called["w"]]) == {"meta"} and called["step"] == 3


def test_a_cpu_wafer_refuses_a_cuda_generator_state_and_takes_a_cpu_one(tmp_path):
    backend = cstorch.backend("CSX", in_process=True, artifact_dir=tmp_path)
    with pytest.raises(ValueError, match=(
            r"the state has 16 bytes, but the CPU generator of the CSX backend's wafer "
            r"\(device='cpu'\) keeps \d+: it was saved from another device's generator")):
        cstorch.set_rng_state(torch.zeros(16, dtype=torch.uint8))
    torch.manual_seed(3)
    state = torch.get_rng_state()
    torch.manual_seed(4)
    cstorch.set_rng_state(state)
    assert torch.equal(cstorch.get_rng_state(), state)
    backend.shutdown()


def _tensors_held(obj, seen=None) -> list:
    """Every tensor a scheduler holds in its attributes, its sub-schedulers' included."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors_held(v, seen)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors_held(v, seen)]
    if isinstance(obj, cstorch.optim.lr_scheduler.Scheduler):
        return [t for k, v in vars(obj).items() if k != "optimizer"
                for t in _tensors_held(v, seen)]
    return []


@pytest.mark.parametrize("name", sorted(_scheduler_cases()[0]))
def test_a_scheduler_state_saved_on_the_cpu_loads_onto_the_backend_device(name, tmp_path):
    cases, build, make_optimizer = _scheduler_cases()
    backend = cstorch.backend("CPU", artifact_dir=tmp_path)
    sched = build(cstorch, make_optimizer(cstorch), cases[name])
    for _ in range(5):
        sched.step()
    saved = sched.state_dict()  # CPU tensors, as cstream.load reads a checkpoint
    backend.shutdown()
    meta = EagerBackend(CPUOptions(artifact_dir=tmp_path), torch_device="meta")
    opt = make_optimizer(cstorch)
    sched = build(cstorch, opt, cases[name])
    sched.load_state_dict(saved)
    sched.step()
    assert devices(_tensors_held(sched)) == {"meta"}
    meta.shutdown()


def test_map_location_cache_of_the_cerebras_api_reads_into_cpu_memory(tmp_path):
    path = tmp_path / "ckpt.h5"
    cstorch.save({"w": torch.arange(3.0)}, path)
    loaded = cstorch.load(path, map_location="cache")
    assert loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], torch.arange(3.0))
    with pytest.raises(ValueError, match="map_location='nowhere' is not a usable device here"):
        cstorch.load(path, map_location="nowhere")


# -- an eager step adds nothing a plain loop would not do --------------------------------------------

class HostReads(TorchDispatchMode):
    """Counts the aten ops that read a tensor's value on the host: a scalar read, or a copy
    from another device to the CPU."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
             torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)]
        to_host = (isinstance(out, torch.Tensor) and out.device.type == "cpu"
                   and any(t.device.type != "cpu" for t in inputs))
        if func in self.READS or to_host:
            self.reads.append(str(func))
        return out


def _eager_loop(backend, closure_every: int = 0) -> list:
    """The training loop of test_a_training_loop_keeps_every_tensor_on_the_backend_device (dynamic
    loss scaling, clipping, a scheduler, a metric) for 4 steps under :class:`HostReads`; a step
    closure reading the loss every ``closure_every`` steps (0: none). The reads counted."""
    with backend.device:
        model = _Net()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = cstorch.optim.lr_scheduler.LinearLR(opt, 0.1, 0.01, 10)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    accuracy = cstorch.metrics.AccuracyMetric("acc")
    losses = []

    @cstorch.trace
    def step(batch):
        x, y = batch
        out = compiled(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        cstorch.amp.optimizer_step(loss, opt, scaler, max_gradient_norm=1.0)
        sched.step()
        accuracy(labels=y, predictions=out.argmax(-1))
        return loss

    @cstorch.step_closure
    def read(loss):
        losses.append(loss.item())

    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(_input_fn),
                                               num_steps=4)
    with HostReads() as counted:
        for batch in executor:
            loss = step(batch)
            if closure_every and executor.user_iteration % closure_every == 0:
                read(loss)
    return counted.reads


def test_an_eager_loop_on_the_device_reads_nothing_on_the_host(meta_backend):
    """On the eager backends' device (meta here: nothing can be read from it) four steps of a
    loop with loss scaling, clipping, a scheduler and a metric read no value on the host."""
    assert _eager_loop(meta_backend) == []


def test_the_host_reads_of_an_eager_loop_are_those_its_step_closures_make(tmp_path):
    cpu = cstorch.backend("CPU", artifact_dir=tmp_path / "cpu")
    try:
        assert _eager_loop(cpu) == []
        assert _eager_loop(cpu, closure_every=2) == ["aten._local_scalar_dense.default"] * 2
    finally:
        cpu.shutdown()


def test_an_eager_step_runs_under_no_torch_function_mode_unless_given_narrow_int_labels(tmp_path):
    """Integer labels narrower than int64 are widened for cross_entropy by a TorchFunctionMode,
    which costs Python work on every op; an eager step enters it only when its inputs hold
    such a tensor."""
    backend = cstorch.backend("CPU", artifact_dir=tmp_path / "run")
    try:
        model = torch.nn.Linear(4, 3)
        compiled = cstorch.compile(model, backend)
        depths = []

        @cstorch.trace
        def step(x, y):
            depths.append(torch_function_mode_depth())
            return torch.nn.functional.cross_entropy(compiled(x), y)

        x = torch.randn(2, 4)
        wide = step(x, torch.tensor([0, 2]))
        narrow = step(x, torch.tensor([0, 2], dtype=torch.int32))
        assert depths == [0, 1]
        assert torch.equal(wide, narrow)
    finally:
        backend.shutdown()
