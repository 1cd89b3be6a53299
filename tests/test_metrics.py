"""cstream.metrics against independent references (scikit-learn or written out here)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn import metrics as sk

import cstream as cstorch
import cstream.experimental.metrics as exp_metrics
from cstream import metrics as M

K = 5


def batches(n=4, size=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, K, (size,), generator=g), torch.randint(0, K, (size,), generator=g),
             torch.rand(size, generator=g)) for _ in range(n)]


def concat(data):
    return (torch.cat([d[0] for d in data]).numpy(), torch.cat([d[1] for d in data]).numpy(),
            torch.cat([d[2] for d in data]).numpy())


def test_the_experimental_path_is_the_same_module():
    assert exp_metrics is M and cstorch.experimental.metrics is M


def test_accuracy_with_weights_equals_sklearn():
    m = M.AccuracyMetric("acc")
    data = batches()
    for y, p, w in data:
        m(labels=y, predictions=p, weights=w)
    y, p, w = concat(data)
    assert float(m) == pytest.approx(sk.accuracy_score(y, p, sample_weight=w), abs=1e-6)
    assert m.num_updates == 4


def test_mean_equals_numpy_weighted_average():
    m = M.MeanMetric("mean")
    vals, ws = [], []
    for i in range(3):
        v, w = torch.randn(10), torch.rand(10)
        m(v, weights=w)
        vals.append(v), ws.append(w)
    ref = np.average(torch.cat(vals).numpy(), weights=torch.cat(ws).numpy())
    assert float(m) == pytest.approx(ref, abs=1e-6)


def test_perplexity_is_exp_of_the_token_weighted_mean_loss():
    m = M.PerplexityMetric("ppl")
    total, tokens = 0.0, 0.0
    for i in range(3):
        labels = torch.zeros(4, 7)
        mask = (torch.rand(4, 7) > 0.3).float()
        loss = torch.tensor(1.0 + 0.3 * i)
        m(labels=labels, loss=loss, weights=mask)
        total += float(loss) * float(mask.sum())
        tokens += float(mask.sum())
    assert float(m) == pytest.approx(math.exp(total / tokens), rel=1e-6)


@pytest.mark.parametrize("average", ["micro", "macro"])
def test_fbeta_equals_sklearn(average):
    m = M.FBetaScoreMetric("f", num_classes=K, beta=2.0, average_type=average)
    data = batches()
    for y, p, _ in data:
        m(labels=y, predictions=p)
    y, p, _ = concat(data)
    ref = sk.fbeta_score(y, p, beta=2.0, average=average, labels=list(range(K)), zero_division=0)
    assert float(m) == pytest.approx(ref, abs=1e-6)


def test_fbeta_ignores_ignored_labels_like_sklearn_restricted_to_the_other_classes():
    m = M.FBetaScoreMetric("f", num_classes=K, average_type="macro", ignore_labels=[0])
    data = batches()
    for y, p, _ in data:
        m(labels=y, predictions=p)
    y, p, _ = concat(data)
    keep = y != 0
    ref = sk.fbeta_score(y[keep], p[keep], beta=1.0, average="macro", labels=[1, 2, 3, 4],
                         zero_division=0)
    assert float(m) == pytest.approx(ref, abs=1e-6)


def _confusion(y, p, w=None):
    return sk.confusion_matrix(y, p, labels=list(range(K)), sample_weight=w)


def test_mean_iou_dice_and_per_class_accuracy_equal_their_definitions():
    data = batches()
    iou, dice, mpca = (M.MeanIOUMetric("iou", K), M.DiceCoefficientMetric("dice", K),
                       M.MeanPerClassAccuracyMetric("mpca", K))
    for y, p, w in data:
        for m in (iou, dice, mpca):
            m(labels=y, predictions=p, weights=w)
    y, p, w = concat(data)
    cm = _confusion(y, p, w)
    tp = np.diag(cm)
    assert float(iou) == pytest.approx(np.mean(tp / (cm.sum(0) + cm.sum(1) - tp)), abs=1e-6)
    assert float(dice) == pytest.approx(np.mean(2 * tp / (cm.sum(0) + cm.sum(1))), abs=1e-6)
    assert float(mpca) == pytest.approx(sk.balanced_accuracy_score(y, p, sample_weight=w),
                                        abs=1e-6)


def test_precision_and_recall_at_k_equal_their_definitions():
    g = torch.Generator().manual_seed(3)
    prec, rec = M.PrecisionAtKMetric("p@3", k=3), M.RecallAtKMetric("r@3", k=3)
    ps, rs = [], []
    for _ in range(3):
        labels = torch.stack([torch.randperm(10, generator=g)[:4] for _ in range(6)])
        labels[:, 3] = -1  # padding
        preds = torch.stack([torch.randperm(10, generator=g)[:5] for _ in range(6)])
        prec(labels=labels, predictions=preds)
        rec(labels=labels, predictions=preds)
        for lab, pr in zip(labels.tolist(), preds.tolist()):
            relevant = {x for x in lab if x >= 0}
            hits = len(set(pr[:3]) & relevant)
            ps.append(hits / 3)
            rs.append(hits / len(relevant))
    assert float(prec) == pytest.approx(np.mean(ps), abs=1e-6)
    assert float(rec) == pytest.approx(np.mean(rs), abs=1e-6)


def test_auc_equals_the_thresholded_trapezoid_and_approaches_sklearn():
    g = torch.Generator().manual_seed(4)
    m = M.AUCMetric("auc", num_thresholds=200)
    ys, ps = [], []
    for _ in range(4):
        y = torch.randint(0, 2, (50,), generator=g)
        p = torch.clamp(y * 0.3 + torch.rand(50, generator=g) * 0.7, 0, 1)
        m(labels=y, predictions=p)
        ys.append(y), ps.append(p)
    y, p = torch.cat(ys).double(), torch.cat(ps).double()
    thr = [-1e-7] + [(i + 1) / 199 for i in range(198)] + [1 + 1e-7]
    tpr, fpr = [], []
    for t in thr:
        pred = p > t
        tp, fp = float((pred & (y == 1)).sum()), float((pred & (y == 0)).sum())
        tpr.append(tp / float((y == 1).sum()))
        fpr.append(fp / float((y == 0).sum()))
    ref = sum((fpr[i] - fpr[i + 1]) * (tpr[i] + tpr[i + 1]) / 2 for i in range(len(thr) - 1))
    assert float(m) == pytest.approx(ref, abs=1e-6)
    assert float(m) == pytest.approx(sk.roc_auc_score(y, p), abs=5e-3)


def test_a_shape_mismatch_is_a_clear_error():
    m = M.AccuracyMetric("acc")
    with pytest.raises(ValueError, match=r"labels has shape \(4,\) but predictions has shape \(5,\)"):
        m(labels=torch.zeros(4), predictions=torch.zeros(5))


def test_labels_out_of_range_are_ignored_with_the_documented_warning():
    m = M.MeanIOUMetric("iou", num_classes=3)
    m(labels=torch.tensor([0, 1, 7, -1]), predictions=torch.tensor([0, 1, 1, 1]))
    with pytest.warns(UserWarning, match=r"iou: 2 .*outside \[0, 3\) and were ignored"):
        value = float(m)
    assert value == pytest.approx(1.0)  # only the two valid samples count, both right


def test_reset_starts_a_new_evaluation():
    m = M.AccuracyMetric("acc")
    m(labels=torch.tensor([1, 1]), predictions=torch.tensor([0, 0]))
    m.reset()
    m(labels=torch.tensor([1, 1]), predictions=torch.tensor([1, 1]))
    assert float(m) == 1.0


class CustomMetric(cstorch.metrics.Metric):
    """Seed 004's skeleton, filled in: the fraction of predictions above a threshold."""

    def __init__(self, name, threshold=0.5):
        self.threshold = threshold
        super().__init__(name)

    def reset(self):
        self.register_state("above", torch.tensor(0.0))
        self.register_state("total", torch.tensor(0.0))

    def update(self, predictions):
        self.above.add_((predictions > self.threshold).float().sum())
        self.total.add_(predictions.numel())

    def compute(self):
        return float(self.above / self.total)


def _evaluate(kind, **options):
    """Seed 004's example: a traced eval step with AccuracyMetric and a custom metric."""
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    model = torch.nn.Linear(6, 3)
    compiled = cstorch.compile(model, backend)
    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    custom = CustomMetric("above")

    @cstorch.trace
    def eval_step(batch):
        inputs, targets = batch
        outputs = compiled(inputs)
        accuracy(labels=targets.clone(), predictions=outputs.argmax(-1).int())
        custom(torch.softmax(outputs, -1).max(-1).values)

    def input_fn():
        g = torch.Generator().manual_seed(9)
        return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
                for _ in range(5)]

    results = []
    for _ in range(2):  # two evaluation runs, reset between them
        accuracy.reset()
        custom.reset()
        with torch.no_grad():
            for batch in cstorch.utils.data.DataExecutor(
                    cstorch.utils.data.DataLoader(input_fn), num_steps=5):
                eval_step(batch)
        results.append((float(accuracy), float(custom), accuracy.num_updates))
    backend.shutdown()
    return results


def test_seed_004_example_and_a_custom_metric_give_the_same_values_on_cpu_and_csx():
    cpu = _evaluate("CPU")
    csx = _evaluate("CSX", in_process=True)
    assert cpu[0] == cpu[1]  # reset between runs
    assert cpu[0][2] == 5
    for a, b in zip(cpu, csx):
        assert a[0] == pytest.approx(b[0], abs=1e-6)
        assert a[1] == pytest.approx(b[1], abs=1e-6)
        assert a[2] == b[2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
