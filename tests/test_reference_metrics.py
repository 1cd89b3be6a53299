"""cstream.metrics against the real cerebras.pytorch 2.10 metrics: the figures in
``reference/fixtures/metrics.json`` (written by ``reference/gen_metrics.py`` under the real
package; rerun with ``make reference``). Every case is fed the stored inputs eagerly on the CPU
backend and inside one traced step on CSX (in-process, and a few on Ray); the values must equal
the reference within float32's bound across CPUs (``reference/tolerance.py``; every case is at
most 3 updates, each a step)."""

from __future__ import annotations

import gc

import inspect
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

import cstream as cstorch
from cstream import metrics
from reference.tolerance import rel_bound

# compares with numbers another program made on another CPU (make test reruns these under
# other float kernels: ATEN_CPU_CAPABILITY / MKL_CBWR)
pytestmark = pytest.mark.cross_cpu

FIXTURE = json.loads((Path(__file__).parent / "reference" / "fixtures" / "metrics.json")
                     .read_text())
CASES = {c["id"]: c for c in FIXTURE["cases"]}
# the reference ran on another CPU and torch version: float32's bound for a case's 3 updates
UPDATES = max(len(c["updates"]) for c in FIXTURE["cases"])
REL = rel_bound(UPDATES)


def dec(value):
    if isinstance(value, dict) and "tensor" in value:
        return torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"])) \
            .reshape(value["shape"])
    if isinstance(value, dict) and "torch_dtype" in value:
        return getattr(torch, value["torch_dtype"])
    return value


def build(case):
    return getattr(metrics, case["cls"])(*[dec(a) for a in case["args"]],
                                         **{k: dec(v) for k, v in case["kwargs"].items()})


def updates(case):
    return [{k: dec(v) for k, v in u.items()} for u in case["updates"]]


def number(x) -> float:
    return math.nan if x == "nan" else x


def assert_close(got: float, want, what: str) -> None:
    want = number(want)
    if math.isnan(want):
        assert math.isnan(got), f"{what}: {got} but the reference is nan"
    else:
        assert got == pytest.approx(want, rel=REL, abs=1e-12), what


def assert_result(got, want: dict, what: str, check_dtype: bool = True) -> None:
    """``got`` is what compute() returned: the same kind (0-d tensor or Python float), dtype
    and value as the reference's."""
    if want["type"] == "tensor":
        assert isinstance(got, torch.Tensor) and got.shape == (), f"{what}: {got!r}"
        if check_dtype:
            assert str(got.dtype) == f"torch.{want['dtype']}", what
    else:
        assert type(got).__name__ == want["type"], f"{what}: {got!r}"
    assert_close(float(got), want["value"], what)


def assert_state(metric, want: dict, what: str) -> None:
    """Every state tensor of the reference is a state of the cstream metric, of the same shape
    and values (cstream keeps float64 where the real package keeps float32, and a few counters
    of its own)."""
    buffers = dict(metric.named_buffers())
    for name, ref in want.items():
        assert name in buffers, f"{what}: no state {name!r}; cstream has {sorted(buffers)}"
        got = buffers[name].to("cpu")
        assert list(got.shape) == ref["shape"], f"{what}: {name}"
        assert torch.allclose(got.double(), dec(ref).double(), rtol=REL, atol=1e-6), \
            f"{what}: {name}"


def compute(metric):
    """compute(), allowing only the warning that the value is nan (a metric with no data)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = metric.compute()
    for w in caught:
        assert "the value is nan" in str(w.message) and math.isnan(float(value)), w.message
    return value


# -- signatures, names, the module -----------------------------------------------------------------

def positional_params(fn):
    return [[p.name, "<required>" if p.default is inspect.Parameter.empty else p.default]
            for p in list(inspect.signature(fn).parameters.values())[1:]
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]


def reference_params(entries):
    return [[name, dec(default)] for name, _, default in entries]


@pytest.mark.parametrize("cls", sorted(FIXTURE["signatures"]))
def test_constructor_and_update_take_the_cerebras_parameters_in_order(cls):
    want = FIXTURE["signatures"][cls]
    ours = getattr(metrics, cls)
    assert positional_params(ours.__init__) == reference_params(want["__init__"])
    assert positional_params(ours.update) == reference_params(want["update"])
    kw_only = [p.name for p in inspect.signature(ours.__init__).parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert kw_only == ["compute_on_system"]  # the porting guide's AccuracyMetric(..., compute_on_system=)


def test_the_module_exports_the_cerebras_names_and_star_import_works():
    assert metrics.__all__ == FIXTURE["registry"]["all"]
    namespace = {}
    exec("from cstream.metrics import *", namespace)
    assert set(FIXTURE["registry"]["all"]) <= set(namespace)
    assert callable(metrics.get_all_metrics)


@pytest.mark.filterwarnings("ignore:.*the value is nan")
def test_get_all_metrics_names_metrics_as_cerebras_and_compute_all_metrics_reads_them():
    prefix = "test_reference_metrics/"
    built = [getattr(metrics, cls)(**({"num_classes": 3} if cls == "MeanIOUMetric" else {}),
                                   name=prefix + name)
             for cls, name in FIXTURE["registry"]["built"]]
    built[0](labels=torch.tensor([1, 2]), predictions=torch.tensor([1, 0]))
    names = [n for n, _ in metrics.get_all_metrics() if n.startswith(prefix)]
    assert names == [prefix + n for n in FIXTURE["registry"]["names"]]
    # compute_all_metrics computes every metric alive in the process: free first the metrics of
    # earlier tests that only a reference cycle keeps alive (their backends are shut down)
    gc.collect()
    values = {n: v for n, v in metrics.compute_all_metrics().items() if n.startswith(prefix)}
    assert list(values) == names and values[names[0]] == 0.5
    del built
    assert not [n for n, _ in metrics.get_all_metrics() if n.startswith(prefix)]


@pytest.mark.parametrize("entry", FIXTURE["errors"], ids=lambda e: f"{e['cls']}{e['kwargs']}")
def test_arguments_the_cerebras_package_refuses_are_refused_with_the_same_exception(entry):
    with pytest.raises({"ValueError": ValueError, "TypeError": TypeError}[entry["error"]]):
        getattr(metrics, entry["cls"])(*entry["args"], **entry["kwargs"])


FRESH = {  # as gen_metrics.fresh_values builds them
    "AccuracyMetric": ("a",), "MeanMetric": ("m",), "PerplexityMetric": ("p",),
    "FBetaScoreMetric": (3,), "MeanIOUMetric": (3,), "DiceCoefficientMetric": (3,),
    "MeanPerClassAccuracyMetric": (3,), "AUCMetric": (), "AUCMetric/PR": (200, "PR"),
    "PrecisionAtKMetric": (2,), "RecallAtKMetric": (2,),
}


@pytest.mark.parametrize("key", sorted(FIXTURE["fresh"]))
def test_a_metric_never_updated_computes_the_cerebras_value(key):
    metric = getattr(metrics, key.split("/")[0])(*FRESH[key])
    assert_result(compute(metric), FIXTURE["fresh"][key], key)


def test_a_metric_never_updated_computes_the_cerebras_value_on_csx_too():
    cstorch.backend("CSX", in_process=True)
    for key in ("AccuracyMetric", "MeanIOUMetric", "AUCMetric/PR", "RecallAtKMetric"):
        metric = getattr(metrics, key.split("/")[0])(*FRESH[key])
        assert_result(compute(metric), FIXTURE["fresh"][key], f"{key} on CSX")


# -- every case, eagerly on the CPU backend -----------------------------------------------------

@pytest.mark.parametrize("case_id", list(CASES))
def test_each_case_equals_cerebras_after_every_update_and_after_reset_on_cpu(case_id):
    case = CASES[case_id]
    cstorch.backend("CPU")
    metric = build(case)
    for i, (upd, want) in enumerate(zip(updates(case), case["after_each"])):
        assert metric(**upd) is None
        assert_result(compute(metric), want, f"{case_id} after update {i + 1}")
    assert metric.num_updates == case["num_updates"]
    assert_state(metric, case["state"], case_id)
    metric.reset()
    after = case["after_reset"]
    # the dtype= of the last update stays after reset() (a traced update sets it only once)
    assert_result(compute(metric), after["value"], f"{case_id} after reset", check_dtype=False)
    assert metric.num_updates == after["num_updates"] == 0
    assert_state(metric, after["state"], f"{case_id} after reset")
    metric.update(**updates(case)[0])
    assert_result(compute(metric), case["after_reset_and_first_update"],
                  f"{case_id} after reset and one update")


def test_the_name_may_come_first_as_in_earlier_cstream_and_defaults_to_the_class_name():
    case = CASES["miou/ignore_1"]
    real_order = build(case)
    name_first = metrics.MeanIOUMetric("miou", 6, [1])
    for upd in updates(case):
        real_order(**upd)
        name_first(**upd)
    assert name_first.name == "miou" and name_first.ignored == [1]
    assert float(name_first) == float(real_order)
    assert real_order.name == "MeanIOUMetric"  # the real package leaves None (docstring: class)
    assert metrics.AUCMetric("auc", 11, "PR").num_thresholds == 11
    with pytest.raises(TypeError, match="the name was given twice"):
        metrics.PrecisionAtKMetric("p", name="q")


# -- every case, traced on CSX --------------------------------------------------------------------

def csx_cases(ids=None):
    return [c for c in FIXTURE["cases"] if ids is None or c["id"] in ids]


def split(case):
    """Each update's tensors (fed through the loader) and its other arguments (constants of
    the step: Python numbers, dtypes), the same in every update of a case."""
    ups = updates(case)
    const = {k: v for k, v in ups[0].items() if not isinstance(v, torch.Tensor)}
    return [{k: v for k, v in u.items() if k not in const} for u in ups], const


def case_batches(ids=None):
    """The loader's batches: batch i holds every case's i-th update, by case index."""
    per_case = [split(c)[0] for c in csx_cases(ids)]
    return [{str(j): ups[i] for j, ups in enumerate(per_case)} for i in range(3)]


def all_case_batches():
    return case_batches()


RAY_IDS = ["accuracy/mask_weights", "mpca/weights", "auc/pr_interpolation_weights",
           "recall_at_k/k3_vector_weights"]


def ray_case_batches():
    return case_batches(RAY_IDS)


def run_traced(input_fn, ids=None, runs=2, cs_config=None, **options):
    """Every case's metric updated inside one traced step (3 steps); a step closure reads
    every value after each step. Then reset() and the same run again."""
    backend = cstorch.backend("CSX", **options)
    cases = csx_cases(ids)
    built = [build(c) for c in cases]
    consts = [split(c)[1] for c in cases]
    seen = []

    @cstorch.step_closure
    def read_all():
        seen.append([compute(m) for m in built])

    @cstorch.trace
    def step(batch):
        for j, (metric, const) in enumerate(zip(built, consts)):
            metric(**batch[str(j)], **const)
        read_all()

    for run in range(runs):
        for m in built:
            m.reset()
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(input_fn), num_steps=3, cs_config=cs_config)
        for batch in executor:
            step(batch)
        for case, metric in zip(cases, built):
            assert metric.num_updates == 3, case["id"]
            assert_state(metric, case["state"], f"{case['id']} run {run + 1}")
    backend.shutdown()
    assert len(seen) == 3 * runs
    for s, values in enumerate(seen):
        for case, value in zip(cases, values):
            assert_result(value, case["after_each"][s % 3],
                          f"{case['id']} traced, run {s // 3 + 1}, step {s % 3 + 1}")


def test_every_case_updated_inside_a_traced_step_on_csx_equals_cerebras():
    run_traced(all_case_batches, in_process=True)


@pytest.mark.slow
@pytest.mark.timeout(900)  # inductor compiles the step of 49 metrics: minutes on a loaded machine
def test_every_case_traced_and_compiled_by_inductor_equals_cerebras():
    # long runs on the default compiler="auto" switch to inductor's compile of the step
    run_traced(all_case_batches, in_process=True, compiler="inductor")


def test_metrics_updated_on_csx_with_input_workers_on_ray_equal_cerebras(ray_session):
    run_traced(ray_case_batches, RAY_IDS, runs=1,
               cs_config=cstorch.utils.CSConfig(num_workers_per_csx=1))
