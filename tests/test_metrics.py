"""cstream.metrics: values against independent references, the example of Cerebras'
evaluation-metrics guide and a custom metric on the CPU backend, traced updates on CSX, and
clear errors for wrong input."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

import cstream as cstorch
from cstream import metrics

UPDATES = 4


def batches(seed, n=UPDATES, size=40, k=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        labels = torch.randint(0, k, (size,), generator=g)
        noisy = torch.randint(0, k, (size,), generator=g)
        keep = torch.rand(size, generator=g) < 0.5
        predictions = torch.where(keep, labels, noisy).int()
        weights = torch.rand(size, generator=g) * (torch.rand(size, generator=g) < 0.8)
        out.append((labels, predictions, weights.double()))
    return out


def cat(bs, i):
    return torch.cat([b[i] for b in bs]).numpy()


def feed(metric, bs, weighted=True):
    for y, p, w in bs:
        metric(labels=y, predictions=p, **({"weights": w} if weighted else {}))
    return float(metric)


# -- values against references -----------------------------------------------------------------

def test_accuracy_equals_sklearn_accuracy_over_several_updates_and_masked_entries():
    bs = batches(0)
    assert feed(metrics.AccuracyMetric("acc"), bs, weighted=False) == pytest.approx(
        skm.accuracy_score(cat(bs, 0), cat(bs, 1)), abs=1e-6)
    masked = [(y, p, (w > 0).double()) for y, p, w in bs]
    keep = cat(masked, 2) > 0
    assert feed(metrics.AccuracyMetric("acc"), masked) == pytest.approx(
        skm.accuracy_score(cat(bs, 0)[keep], cat(bs, 1)[keep]), abs=1e-6)


def test_weighted_accuracy_divides_by_the_count_of_nonzero_weights_as_cerebras():
    bs = batches(0)
    y, p, w = cat(bs, 0), cat(bs, 1), cat(bs, 2)
    want = float(((y == p) * w).sum() / (w > 0).sum())
    assert feed(metrics.AccuracyMetric("acc"), bs) == pytest.approx(want, rel=1e-6)


def test_mean_equals_the_weighted_average_of_every_value():
    g = torch.Generator().manual_seed(1)
    m = metrics.MeanMetric("mean")
    values, weights = [], []
    for _ in range(UPDATES):
        v, w = torch.randn(3, 7, generator=g), torch.rand(7, generator=g)
        m(v, weight=w)
        values.append(v.numpy())
        weights.append(np.broadcast_to(w.numpy(), (3, 7)))
    m(torch.tensor(2.5))
    values.append(np.array([[2.5]]))
    weights.append(np.array([[1.0]]))
    want = np.average(np.concatenate([v.ravel() for v in values]),
                      weights=np.concatenate([w.ravel() for w in weights]))
    assert float(m) == pytest.approx(want, abs=1e-6)


def test_perplexity_is_exp_of_summed_token_loss_over_unmasked_tokens():
    g = torch.Generator().manual_seed(2)
    ppl = metrics.PerplexityMetric("ppl")
    token_losses, mask_all = [], []
    for _ in range(UPDATES):
        logits = torch.randn(2, 6, 11, generator=g)
        labels = torch.randint(0, 11, (2, 6), generator=g)
        mask = (torch.rand(2, 6, generator=g) < 0.7).long()
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 11), labels.reshape(-1), reduction="none").reshape(2, 6)
        ppl(labels=labels, loss=(per_token * mask).sum(), weights=mask)
        token_losses.append(per_token[mask.bool()].numpy())
        mask_all.append(mask.numpy())
    all_losses = np.concatenate(token_losses)
    # float32 both sides, summed in another order than numpy's mean, and exp of it rounded to
    # float32 (one ulp at 13.5 is 9.5e-7): a few ulps apart, so a relative bound of ~8 ulps
    assert float(ppl) == pytest.approx(math.exp(all_losses.mean()), rel=1e-6)
    unmasked = metrics.PerplexityMetric("ppl")
    unmasked(labels=torch.zeros(4, dtype=torch.long), loss=torch.tensor(4 * 1.5))
    assert float(unmasked) == pytest.approx(math.exp(1.5), rel=1e-6)  # a float32 result


@pytest.mark.parametrize("average", ["micro", "macro"])
@pytest.mark.parametrize("beta,ignore", [(1.0, None), (0.5, [2]), (2.0, [0, 4])])
def test_fbeta_equals_sklearn_fbeta_score(average, beta, ignore):
    bs = batches(3)
    got = feed(metrics.FBetaScoreMetric(5, beta=beta, average_type=average,
                                        ignore_labels=ignore, name="f"), bs, weighted=False)
    kept = [c for c in range(5) if c not in (ignore or [])]
    want = skm.fbeta_score(cat(bs, 0), cat(bs, 1), beta=beta, labels=kept, average=average,
                           zero_division=0)
    assert got == pytest.approx(want, abs=1e-6)


def per_class_scores(bs, score_fn):
    y, p, w = cat(bs, 0), cat(bs, 1), cat(bs, 2)
    return score_fn(y, p, labels=list(range(6)), average=None, sample_weight=w, zero_division=0)


@pytest.mark.parametrize("ignore", [[], [1]])
def test_mean_iou_and_dice_equal_sklearn_per_class_means_over_the_classes_that_occur(ignore):
    # six classes, labels and predictions in 0..4: class 5 never occurs and must not count
    bs = batches(4)
    y, p, w = cat(bs, 0), cat(bs, 1), cat(bs, 2)
    present = [c for c in range(6) if c not in ignore and any(w[(y == c) | (p == c)] > 0)]
    for metric, fn in [(metrics.MeanIOUMetric(6, ignore_classes=ignore), skm.jaccard_score),
                       (metrics.DiceCoefficientMetric(6, ignore), skm.f1_score)]:
        want = float(np.mean(per_class_scores(bs, fn)[present]))
        assert feed(metric, bs) == pytest.approx(want, abs=1e-6), metric


def test_mean_per_class_accuracy_averages_sklearn_per_class_recall_over_all_classes():
    # class 5 never occurs: it counts as 0, as cerebras.pytorch (not balanced accuracy, which
    # averages over the classes that occur)
    bs = batches(4)
    want = float(np.mean(per_class_scores(bs, skm.recall_score)))
    assert feed(metrics.MeanPerClassAccuracyMetric(6, name="mpca"), bs) == pytest.approx(
        want, abs=1e-6)
    seen_only = metrics.MeanPerClassAccuracyMetric(5)
    assert feed(seen_only, bs) == pytest.approx(
        skm.balanced_accuracy_score(cat(bs, 0), cat(bs, 1), sample_weight=cat(bs, 2)), abs=1e-6)


def at_k_reference(samples, k, kind):
    num = den = 0.0
    for labels, scores, w in samples:
        for row_labels, row_scores, weight in zip(labels.tolist(), scores.numpy(), w.tolist()):
            top = set(np.argsort(-row_scores)[:k].tolist())
            hits = sum(1 for lab in row_labels if lab in top)
            num += weight * hits
            den += weight * (k if kind == "precision" else len(row_labels))
    return num / den


@pytest.mark.parametrize("kind", ["precision", "recall"])
@pytest.mark.parametrize("k", [1, 3])
def test_precision_and_recall_at_k_equal_a_loop_over_the_top_k_scores(kind, k):
    g = torch.Generator().manual_seed(5)
    cls = metrics.PrecisionAtKMetric if kind == "precision" else metrics.RecallAtKMetric
    metric = cls(k, name=f"{kind}@{k}")
    samples = []
    for _ in range(UPDATES):
        scores = torch.randn(16, 10, generator=g)
        labels = torch.stack([torch.randperm(10, generator=g)[:3] for _ in range(16)])
        w = torch.rand(16, generator=g)
        metric(labels=labels, predictions=scores, weights=w)
        samples.append((labels, scores, w))
    assert float(metric) == pytest.approx(at_k_reference(samples, k, kind), abs=1e-6)


def auc_batches(n_thresholds, seed=6):
    """Predictions on the midpoints of the threshold grid's bins, where thresholded counts are
    exact, so the ROC area must equal scikit-learn's exact roc_auc_score."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(UPDATES):
        bins = torch.randint(0, n_thresholds - 1, (50,), generator=g)
        preds = (bins.double() + 0.5) / (n_thresholds - 1)
        labels = (torch.rand(50, generator=g) < preds * 0.6 + 0.2).long()
        out.append((labels, preds, torch.rand(50, generator=g).double()))
    return out


@pytest.mark.parametrize("n", [200, 11])
def test_roc_auc_equals_sklearn_roc_auc_score_when_predictions_fall_on_distinct_bins(n):
    bs = auc_batches(n)
    got = feed(metrics.AUCMetric(n, name="auc"), bs)
    want = skm.roc_auc_score(cat(bs, 0), cat(bs, 1), sample_weight=cat(bs, 2))
    assert got == pytest.approx(want, abs=1e-6)


def test_pr_auc_minoring_and_majoring_are_the_lower_and_upper_sums_and_bound_interpolation():
    g = torch.Generator().manual_seed(7)
    bs = [((torch.rand(30, generator=g) < 0.4).long(), torch.rand(30, generator=g).double(),
           torch.rand(30, generator=g).double()) for _ in range(UPDATES)]
    got = {how: feed(metrics.AUCMetric(50, "PR", summation_method=how), bs)
           for how in ("minoring", "majoring", "interpolation")}
    y, p, w = cat(bs, 0), cat(bs, 1), cat(bs, 2)
    thresholds = [-1e-7] + [i / 49 for i in range(1, 49)] + [1 + 1e-7]
    rec, prec = [], []
    for t in np.float32(thresholds):
        tp = sum(wi for yi, pi, wi in zip(y, p, w) if pi > t and yi == 1)
        fp = sum(wi for yi, pi, wi in zip(y, p, w) if pi > t and yi == 0)
        rec.append(tp / sum(wi for yi, wi in zip(y, w) if yi == 1))
        prec.append(tp / (tp + fp) if tp + fp > 0 else 0.0)
    for how, pick in (("minoring", min), ("majoring", max)):
        want = sum((rec[i] - rec[i + 1]) * pick(prec[i], prec[i + 1]) for i in range(49))
        assert got[how] == pytest.approx(want, abs=1e-6), how
    assert got["minoring"] < got["interpolation"] < got["majoring"]


# -- the base class ----------------------------------------------------------------------------

class SumOfSquares(metrics.Metric):
    """A custom metric written from the evaluation-metrics guide's skeleton."""

    def __init__(self, name: str):
        super().__init__(name)

    def reset(self):
        self.register_state("total", torch.zeros((), dtype=torch.float64))

    def update(self, values):
        self.total.add_((values.double() ** 2).sum())

    def compute(self):
        return float(self.total)


def test_num_updates_counts_calls_and_update_calls_and_reset_zeroes_it_and_the_state():
    m = SumOfSquares("ss")
    m(torch.tensor([1.0, 2.0]))
    m.update(torch.tensor([3.0]))
    assert (float(m), m.num_updates, m.compute()) == (14.0, 2, 14.0)
    m.reset()
    assert (float(m), m.num_updates) == (0.0, 0)


def test_an_update_that_calls_super_update_counts_once():
    class Twice(SumOfSquares):
        def update(self, values):
            super().update(values)
            super().update(values)

    m = Twice("twice")
    m(torch.tensor([2.0]))
    assert (float(m), m.num_updates) == (8.0, 1)


def test_metric_states_are_buffers_outside_the_state_dict_and_update_builds_no_graph():
    m = SumOfSquares("ss")
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    m(x * 2)
    assert dict(m.named_buffers()).keys() == {"_num_updates", "total"}
    assert m.state_dict() == {}
    assert not m.total.requires_grad


def test_metric_without_the_abstract_methods_cannot_be_created():
    class Incomplete(metrics.Metric):
        def reset(self):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete("x")


def test_reregistering_a_state_with_another_shape_is_refused():
    m = SumOfSquares("ss")
    with pytest.raises(ValueError, match=re.escape(
            "ss: state 'total' was registered with shape () and dtype torch.float64, now with "
            "(2,) and torch.float64")):
        m.register_state("total", torch.zeros(2, dtype=torch.float64))


def test_metric_name_must_be_a_string_and_none_means_the_class_name():
    with pytest.raises(TypeError, match=re.escape(
            "AccuracyMetric: name must be a string (or None for the class name), got 3")):
        metrics.AccuracyMetric(3)
    assert metrics.AccuracyMetric(None).name == "AccuracyMetric"
    assert metrics.RecallAtKMetric(2).name == "RecallAtKMetric"


def test_experimental_metrics_is_the_same_module():
    import cstream.experimental.metrics as exp_metrics

    assert exp_metrics is metrics
    assert exp_metrics.AccuracyMetric is metrics.AccuracyMetric


# -- the metrics guide's and the porting guide's loops on the CPU backend ------------------------

def eval_input_fn():
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(3)]


def evaluate(kind, runs=2, per_step=None, **options):
    """The metrics guide's evaluation twice (reset between runs); with ``per_step`` (a list), a
    step closure called inside the step appends every metric's value after each step, and one
    called in the loop (the porting guide's pattern) appends the accuracy again."""
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    model = torch.nn.Linear(4, 3)
    compiled_model = cstorch.compile(model, backend)
    accuracy = cstorch.metrics.AccuracyMetric("accuracy", compute_on_system=True)
    custom = SumOfSquares("sum_of_squares")
    f1 = cstorch.metrics.FBetaScoreMetric(num_classes=3, average_type="macro", name="f1")

    @cstorch.trace
    def eval_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        accuracy(labels=targets.clone(), predictions=outputs.argmax(-1).int())
        custom(outputs)
        f1(labels=targets, predictions=outputs.argmax(-1))
        if per_step is not None:
            report(outputs)
        return outputs

    @cstorch.step_closure
    def report(outputs):
        per_step.append((float(accuracy), float(custom), float(f1), accuracy.num_updates,
                         float(outputs.detach().sum())))

    @cstorch.step_closure
    def after_step(outputs):
        per_step.append(("loop", float(accuracy), accuracy.num_updates))

    results, outputs = [], []
    for _ in range(runs):
        for m in (accuracy, custom, f1):
            m.reset()
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(eval_input_fn), num_steps=3)
        for batch in executor:
            step_out = eval_step(batch)
            if per_step is not None:
                after_step(step_out)
        results.append((float(accuracy), float(custom), float(f1), accuracy.num_updates))
    with torch.no_grad():
        for x, _ in eval_input_fn():
            outputs.append(model(x).to("cpu") if kind == "CPU" else None)
    backend.shutdown()
    return results, outputs


def test_seed_004_example_and_a_custom_metric_run_on_cpu_and_reset_between_runs():
    results, outputs = evaluate("CPU")
    data = eval_input_fn()
    preds = torch.cat([o.argmax(-1) for o in outputs])
    labels = torch.cat([y for _, y in data])
    want = (float((preds == labels).double().mean()),
            float(sum((o.double() ** 2).sum() for o in outputs)),
            skm.f1_score(labels.numpy(), preds.numpy(), average="macro", labels=[0, 1, 2],
                         zero_division=0), 3)
    for got in results:  # the second run equals the first: reset cleared the state
        assert got[0] == pytest.approx(want[0], rel=1e-6)
        assert got[1] == pytest.approx(want[1], rel=1e-12)
        assert got[2] == pytest.approx(want[2], abs=1e-6)
        assert got[3] == 3


def test_traced_metric_updates_on_csx_equal_the_cpu_backend():
    cpu, _ = evaluate("CPU")
    csx, _ = evaluate("CSX", in_process=True)
    assert csx == cpu


def test_metrics_read_inside_a_step_closure_on_csx_give_the_value_after_that_step():
    cpu_steps, csx_steps = [], []
    cpu, _ = evaluate("CPU", per_step=cpu_steps)
    csx, _ = evaluate("CSX", per_step=csx_steps, in_process=True)
    assert csx == cpu
    inside = [s for s in csx_steps if s[0] != "loop"]
    loop = [s for s in csx_steps if s[0] == "loop"]
    assert [s[3] for s in inside] == [1, 2, 3, 1, 2, 3]
    assert [(s[1], s[2]) for s in loop] == [(s[0], s[3]) for s in inside]
    assert len(csx_steps) == len(cpu_steps) == 12
    for a, b in zip(csx_steps, cpu_steps):
        assert a[:4] == b[:4]
        assert a[-1] == pytest.approx(b[-1], abs=1e-5)


def test_weights_read_inside_a_step_closure_on_csx_are_still_refused():
    backend = cstorch.backend("CSX", in_process=True)
    model = torch.nn.Linear(4, 3)
    compiled = cstorch.compile(model, backend)
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    seen = []

    @cstorch.step_closure
    def report(loss):
        seen.append(float(accuracy))
        model.weight.sum().item()

    @cstorch.trace
    def step(batch):
        outputs = compiled(batch[0])
        accuracy(labels=batch[1], predictions=outputs.argmax(-1))
        report(outputs.sum())
        return outputs

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(eval_input_fn), num_steps=3)
    with pytest.raises(RuntimeError, match="can only be read on checkpoint steps"):
        for batch in executor:
            step(batch)
    assert len(seen) == 1 and 0.0 <= seen[0] <= 1.0


# -- wrong input ---------------------------------------------------------------------------------

def test_shape_mismatch_names_both_shapes_and_the_rule():
    acc = metrics.AccuracyMetric("accuracy")
    with pytest.raises(ValueError, match=re.escape(
            "AccuracyMetric 'accuracy': labels has shape (4,) but predictions has shape (4, 3); "
            "they must have the same shape (one predicted class per label; pass "
            "logits.argmax(-1), not the logits).")):
        acc(labels=torch.zeros(4, dtype=torch.long), predictions=torch.zeros(4, 3))
    assert acc.num_updates == 0


def test_weights_of_another_shape_than_the_labels_are_refused():
    miou = metrics.MeanIOUMetric(3, name="miou")
    with pytest.raises(ValueError, match=re.escape(
            "MeanIOUMetric 'miou': labels has shape (2, 4) but weights has shape (3,); weights "
            "must have the labels' shape (one weight per label, 0 masks it).")):
        miou(labels=torch.zeros(2, 4, dtype=torch.long),
             predictions=torch.zeros(2, 4, dtype=torch.long), weights=torch.ones(3))


def test_float_class_ids_count_as_their_integer_part_as_cerebras():
    y, p = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 2, 2, 1])
    as_int = metrics.FBetaScoreMetric(3, average_type="macro")
    as_float = metrics.FBetaScoreMetric(3, average_type="macro")
    as_int(labels=y, predictions=p)
    as_float(labels=y.float(), predictions=p.float() + 0.5)
    assert float(as_float) == float(as_int)
    with pytest.raises(TypeError, match="predictions must hold class ids, got dtype "
                                        "torch.complex64; for logits pass logits.argmax"):
        as_int(labels=y, predictions=p.to(torch.complex64))


@pytest.mark.parametrize("cls", [metrics.FBetaScoreMetric, metrics.MeanIOUMetric,
                                 metrics.DiceCoefficientMetric,
                                 metrics.MeanPerClassAccuracyMetric])
def test_labels_out_of_range_are_ignored_counted_and_reported_by_compute(cls):
    y = torch.tensor([0, 1, 2, 7, -1, 1])
    p = torch.tensor([0, 1, 1, 1, 0, 2])
    w = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # the last one is masked padding
    keep = [0, 1, 2, 5]
    if cls is metrics.FBetaScoreMetric:  # no weights: leave the padding out instead
        y, p, w, keep = y[:5], p[:5], None, [0, 1, 2]
    clean, dirty = cls(3, name="m"), cls(3, name="m")
    weighted = {} if w is None else {"weights": w[keep]}
    clean(labels=y[keep], predictions=p[keep], **weighted)
    dirty(labels=y, predictions=p, **({} if w is None else {"weights": w}))
    with pytest.warns(UserWarning) as record:
        value = float(dirty)
    assert value == float(clean)
    assert [str(r.message) for r in record] == [(
        f"{cls.__name__} 'm': 2 labels were outside the valid range [0, 3) (num_classes=3) since "
        "the last reset(); those samples were ignored (left out of the result). Values cannot "
        "be checked inside the traced step, so they are counted and reported here.")]


def test_masked_out_of_range_labels_and_predictions_do_not_warn():
    miou = metrics.MeanIOUMetric(3, name="miou")
    miou(labels=torch.tensor([0, -100]), predictions=torch.tensor([0, 9]),
         weights=torch.tensor([1, 0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(miou) == 1.0


def test_predictions_out_of_range_are_reported_separately():
    dice = metrics.DiceCoefficientMetric(2, name="dice")
    dice(labels=torch.tensor([0, 1, 1]), predictions=torch.tensor([0, 1, 5]))
    with pytest.warns(UserWarning, match=r"'dice': 1 predictions were outside the valid range "
                                         r"\[0, 2\)"):
        assert float(dice) == 1.0


def test_recall_at_k_counts_a_label_outside_the_scored_classes_as_never_found():
    r = metrics.RecallAtKMetric(1, name="r")
    r(labels=torch.tensor([[0, 12]]), predictions=torch.tensor([[0.9, 0.1, 0.0]]))
    assert float(r) == 0.5


def test_auc_ignores_and_reports_negative_labels_and_predictions_outside_0_1():
    auc = metrics.AUCMetric(name="auc")
    auc(labels=torch.tensor([0, 1, -1, 1]), predictions=torch.tensor([0.2, 0.8, 0.5, 1.5]))
    with pytest.warns(UserWarning, match=r"AUCMetric 'auc': 2 samples had a negative label or a "
                                         r"prediction outside the valid range \[0, 1\]"):
        assert float(auc) == 1.0


def test_auc_counts_every_label_greater_than_0_as_positive():
    two, one = metrics.AUCMetric(11), metrics.AUCMetric(11)
    preds = torch.tensor([0.1, 0.35, 0.6, 0.9])
    two(labels=torch.tensor([0, 2, 0, 5]), predictions=preds)
    one(labels=torch.tensor([0, 1, 0, 1]), predictions=preds)
    assert float(two) == float(one) == 0.75


def test_a_metric_with_no_data_warns_and_gives_nan():
    acc = metrics.AccuracyMetric("accuracy")
    with pytest.warns(UserWarning, match=r"AccuracyMetric 'accuracy': no samples \(or only "
                                         r"samples of weight 0\) were seen since the last reset"):
        assert math.isnan(float(acc))


INVALID_CONSTRUCTORS = [
    (lambda: metrics.FBetaScoreMetric(1),
     "FBetaScoreMetric: num_classes must be an int >= 2, got 1."),
    (lambda: metrics.FBetaScoreMetric(3, average_type="weighted"),
     "FBetaScoreMetric: average_type must be 'micro' or 'macro', got 'weighted'."),
    (lambda: metrics.FBetaScoreMetric(3, beta=0),
     "FBetaScoreMetric: beta: expected a positive number, got 0. Set it above 0."),
    (lambda: metrics.FBetaScoreMetric(3, ignore_labels=[3]),
     "FBetaScoreMetric: ignore_labels=[3] holds [3], not class ids in [0, 3)."),
    (lambda: metrics.MeanIOUMetric(2, ignore_classes=[0, 1]),
     "MeanIOUMetric: ignore_classes=[0, 1] ignores every class; nothing would be measured."),
    (lambda: metrics.MeanPerClassAccuracyMetric(0),
     "MeanPerClassAccuracyMetric: num_classes must be an int >= 1, got 0."),
    (lambda: metrics.PrecisionAtKMetric(0),
     "PrecisionAtKMetric: k: expected a positive int, got 0. Set it to 1 or more."),
    (lambda: metrics.AUCMetric(curve="DET"),
     "AUCMetric: curve must be 'ROC' or 'PR', got 'DET'."),
    (lambda: metrics.AUCMetric(1),
     "AUCMetric: num_thresholds must be an int >= 2, got 1."),
    (lambda: metrics.AUCMetric(summation_method="trapezoid"),
     "AUCMetric: summation_method must be one of ['interpolation', 'minoring', 'majoring'], "
     "got 'trapezoid'."),
    (lambda: metrics.AUCMetric(thresholds=[0.5, 1.5]),
     "AUCMetric: thresholds must lie in [0, 1] (the end points below 0 and above 1 are added), "
     "got [1.5]."),
]


@pytest.mark.parametrize("make,message", INVALID_CONSTRUCTORS)
def test_invalid_constructor_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_k_larger_than_the_number_of_classes_and_bad_shapes_are_refused():
    p = metrics.PrecisionAtKMetric(5, name="p")
    with pytest.raises(ValueError, match=re.escape(
            "PrecisionAtKMetric 'p': k=5 but predictions score only 3 classes")):
        p(labels=torch.tensor([0]), predictions=torch.rand(1, 3))
    with pytest.raises(ValueError, match=re.escape(
            "labels has shape (2, 1) and predictions has shape (3, 6); labels must be")):
        p(labels=torch.tensor([[0], [1]]), predictions=torch.rand(3, 6))
    with pytest.raises(ValueError, match=re.escape(
            "weights has shape (2,); it must be a scalar or one weight per sample, shape (3,).")):
        p(labels=torch.tensor([0, 1, 2]), predictions=torch.rand(3, 6), weights=torch.ones(2))


def test_perplexity_refuses_a_per_token_loss():
    ppl = metrics.PerplexityMetric("ppl")
    with pytest.raises(ValueError, match=re.escape(
            "PerplexityMetric 'ppl': loss has shape (2, 3); it must be the batch's loss summed "
            "over its tokens (one number). Pass loss.sum() for per-token losses.")):
        ppl(labels=torch.zeros(2, 3, dtype=torch.long), loss=torch.ones(2, 3))
