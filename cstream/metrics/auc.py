"""Area under the ROC or precision-recall curve from thresholded counts."""

from __future__ import annotations

import torch

from cstream.metrics.metric import (
    _ACC,
    Metric,
    as_tensor,
    check_same_shape,
    warn_out_of_range,
    weights_like,
)

_EPS = 1e-7


class AUCMetric(Metric):
    """Area under the ROC curve (``curve="ROC"``) or the precision-recall curve (``"PR"``) of
    binary ``labels`` (0 or 1) and ``predictions`` (probabilities in ``[0, 1]``).

    The counts of true/false positives and negatives are accumulated at ``num_thresholds``
    thresholds ``[-1e-7, 1/(n-1), 2/(n-1), ..., (n-2)/(n-1), 1 + 1e-7]`` (a prediction is
    positive when it is greater than the threshold), and the area is summed with the
    trapezoidal rule, as TensorFlow's and Cerebras' ``AUC``. When the predictions fall on
    distinct bins of that grid, the ROC area equals the exact one. On the PR curve a threshold
    with no positive predictions has precision 0.

    ``update(labels, predictions, weights=None)``: same shape; ``weights`` broadcasts to it.
    Labels other than 0 and 1 and predictions outside ``[0, 1]`` (or nan) are left out and
    counted; ``compute`` warns about them.

    >>> import torch, cstream
    >>> auc = cstream.metrics.AUCMetric("auc")
    >>> auc(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0.1, 0.6, 0.4, 0.9]))
    >>> float(auc)
    0.75
    """

    def __init__(self, name: str, num_thresholds: int = 200, curve: str = "ROC",
                 compute_on_system=None):
        if curve not in ("ROC", "PR"):
            raise ValueError(f"AUCMetric: curve must be 'ROC' or 'PR', got {curve!r}.")
        if (isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int)
                or num_thresholds < 2):
            raise ValueError(f"AUCMetric: num_thresholds must be an int >= 2, got "
                             f"{num_thresholds!r}.")
        self.num_thresholds = num_thresholds
        self.curve = curve
        super().__init__(name, compute_on_system)

    def thresholds(self, device=None) -> torch.Tensor:
        n = self.num_thresholds
        inner = torch.arange(1, n - 1, dtype=_ACC, device=device) / (n - 1)
        return torch.cat([torch.full((1,), -_EPS, dtype=_ACC, device=device), inner,
                          torch.full((1,), 1 + _EPS, dtype=_ACC, device=device)])

    def reset(self):
        n = self.num_thresholds
        for name in ("true_positives", "false_positives", "true_negatives", "false_negatives"):
            self.register_state(name, torch.zeros(n, dtype=_ACC))
        self.register_state("samples_out_of_range", torch.zeros((), dtype=_ACC))

    def update(self, labels, predictions, weights=None):
        labels = as_tensor(self, "labels", labels)
        predictions = as_tensor(self, "predictions", predictions)
        check_same_shape(self, "labels", labels, "predictions", predictions,
                         "they must have the same shape (one probability per binary label).")
        w = weights_like(self, weights, labels).reshape(-1)
        y = labels.reshape(-1).to(_ACC)
        p = predictions.reshape(-1).to(_ACC)
        ok = ((y == 0) | (y == 1)) & (p >= 0) & (p <= 1)
        self.samples_out_of_range.add_(((~ok).to(_ACC) * (w != 0)).sum())
        w = torch.where(ok, w, torch.zeros_like(w))
        p = torch.where(ok, p, torch.zeros_like(p))
        y = torch.where(ok, y, torch.zeros_like(y))
        pos, neg = y * w, (1 - y) * w
        n = self.num_thresholds
        # bucket b = how many thresholds lie strictly below the prediction; a prediction is a
        # positive at threshold i exactly when b > i
        bucket = torch.searchsorted(self.thresholds(p.device), p.contiguous())
        hist_pos = torch.zeros(n + 1, dtype=_ACC, device=p.device).scatter_add_(0, bucket, pos)
        hist_neg = torch.zeros(n + 1, dtype=_ACC, device=p.device).scatter_add_(0, bucket, neg)
        above_pos = hist_pos.flip(0).cumsum(0).flip(0)[1:]  # sum over buckets > i
        above_neg = hist_neg.flip(0).cumsum(0).flip(0)[1:]
        self.true_positives.add_(above_pos)
        self.false_positives.add_(above_neg)
        self.false_negatives.add_(pos.sum() - above_pos)
        self.true_negatives.add_(neg.sum() - above_neg)

    def compute(self) -> float:
        warn_out_of_range(self, float(self.samples_out_of_range),
                          "samples had a label other than 0/1 or a prediction", "[0, 1]")
        tp, fp, tn, fn = (self._value(s) for s in (self.true_positives, self.false_positives,
                                                   self.true_negatives, self.false_negatives))
        positives, negatives = float(tp[0] + fn[0]), float(fp[0] + tn[0])
        if positives == 0:
            return self._no_data("no positive label was seen")
        recall = tp / positives
        if self.curve == "ROC":
            if negatives == 0:
                return self._no_data("no negative label was seen")
            x, y = fp / negatives, recall
        else:
            x = recall
            y = torch.where(tp + fp > 0, tp / (tp + fp).clamp(min=1e-300), torch.zeros_like(tp))
        return float(((x[:-1] - x[1:]) * (y[:-1] + y[1:]) / 2).sum())
