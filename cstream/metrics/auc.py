"""Area under the ROC or precision-recall curve from thresholded counts."""

from __future__ import annotations

import torch

from cstream.creation import state_tensor
from cstream.metrics.metric import (
    _ACC,
    Metric,
    as_tensor,
    check_same_shape,
    divide_no_nan,
    name_first_also,
    warn_out_of_range,
)

_EPS = 1e-7
_SUMMATIONS = ("interpolation", "minoring", "majoring")


class AUCMetric(Metric):
    """Area under the ROC curve (``curve="ROC"``) or the precision-recall curve (``"PR"``) of
    binary ``labels`` (a label greater than 0 is positive) and ``predictions`` (probabilities in
    ``[0, 1]``), from counts of true/false positives and negatives at fixed thresholds.

    The thresholds are ``num_thresholds`` points ``[-1e-7, 1/(n-1), ..., (n-2)/(n-1), 1 + 1e-7]``,
    or ``thresholds`` (values in ``[0, 1]``; sorted, with the two end points added). A
    prediction is positive at a threshold when it is greater than it. The area is a Riemann sum
    over the thresholds: ``summation_method="interpolation"`` is the trapezoid on the ROC
    curve and, on the PR curve, the interpolation of Davis & Goadrich (2006) between
    thresholds; ``"minoring"`` and ``"majoring"`` take the lower and the upper of the two
    heights, bounding the error of the approximation. All as ``cerebras.pytorch``'s (and
    TensorFlow's) ``AUC``.

    ``update(labels, predictions, weights=None)``: same shape, ``weights`` too (0 masks a
    sample). Negative labels and predictions outside ``[0, 1]`` (or nan) are left out and
    counted; ``compute`` warns about them. ``compute()`` returns a Python float, 0.0 while no
    positive (ROC: or no negative) label was seen.

    >>> import torch, cstream
    >>> auc = cstream.metrics.AUCMetric(name="auc")
    >>> auc(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0.1, 0.6, 0.4, 0.9]))
    >>> round(float(auc), 6)
    0.75
    """

    @name_first_also
    def __init__(self, num_thresholds: int = 200, curve: str = "ROC", name: str | None = None,
                 summation_method: str = "interpolation", thresholds=None, *,
                 compute_on_system: bool | None = None):
        if curve not in ("ROC", "PR"):
            raise ValueError(f"AUCMetric: curve must be 'ROC' or 'PR', got {curve!r}.")
        if summation_method not in _SUMMATIONS:
            raise ValueError(f"AUCMetric: summation_method must be one of {list(_SUMMATIONS)}, "
                             f"got {summation_method!r}.")
        self.curve, self.summation_method = curve, summation_method
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            bad = [t for t in inner if not 0.0 <= t <= 1.0]
            if bad:
                raise ValueError(f"AUCMetric: thresholds must lie in [0, 1] (the end points "
                                 f"below 0 and above 1 are added), got {bad!r}.")
        else:
            if (isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int)
                    or num_thresholds < 2):
                raise ValueError(f"AUCMetric: num_thresholds must be an int >= 2, got "
                                 f"{num_thresholds!r}.")
            inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.num_thresholds = len(inner) + 2
        # float32, as cerebras.pytorch: a prediction equal to a threshold compares the same
        self.thresholds = torch.tensor([0.0 - _EPS, *inner, 1.0 + _EPS], dtype=torch.float32)
        super().__init__(name, compute_on_system=compute_on_system)

    def reset(self):
        n = self.num_thresholds
        for name in ("true_positive", "true_negative", "false_positive", "false_negative"):
            self.register_state(name, torch.zeros(n, dtype=_ACC))
        self.register_state("samples_out_of_range", torch.zeros((), dtype=_ACC))
        if "threshold_grid" not in dict(self.named_buffers(recurse=False)):
            # the thresholds as a state tensor: one made inside the step from Python numbers
            # would be a constant lifted into the graph, which inductor's functionalization
            # refuses. Not readable: it never changes, so no step needs to export it.
            self.register_buffer("threshold_grid", state_tensor(self.thresholds.clone()),
                                 persistent=False)

    def update(self, labels, predictions, weights=None):
        labels = as_tensor(self, "labels", labels)
        predictions = as_tensor(self, "predictions", predictions)
        check_same_shape(self, "labels", labels, "predictions", predictions,
                         "they must have the same shape (one probability per binary label).")
        y = labels.reshape(-1)
        dtype = torch.promote_types(predictions.dtype, torch.float32)
        p = predictions.reshape(-1).to(dtype)
        ok = (y >= 0) & (p >= 0) & (p <= 1)
        if weights is None:  # no tensor of ones: a constant made in the step trips inductor
            self.samples_out_of_range.add_((~ok).to(_ACC).sum())
            w = ok.to(_ACC)
        else:
            weights = as_tensor(self, "weights", weights)
            check_same_shape(self, "labels", labels, "weights", weights,
                             "weights must have the labels' shape (one weight per sample).")
            w = weights.reshape(-1).to(_ACC)
            self.samples_out_of_range.add_(((~ok).to(_ACC) * (w != 0)).sum())
            w = torch.where(ok, w, torch.zeros_like(w))
        p = torch.where(ok, p, torch.zeros_like(p))
        pos = torch.where(y > 0, w, torch.zeros_like(w))
        neg = w - pos
        # above[i, j]: prediction j is a positive at threshold i (greater than it)
        above = (p[None, :] > self.threshold_grid.to(dtype)[:, None]).to(_ACC)
        above_pos, above_neg = above @ pos, above @ neg
        self.true_positive.add_(above_pos)
        self.false_positive.add_(above_neg)
        self.false_negative.add_(pos.sum() - above_pos)
        self.true_negative.add_(neg.sum() - above_neg)

    def compute(self) -> float:
        warn_out_of_range(self, float(self.samples_out_of_range),
                          "samples had a negative label or a prediction", "[0, 1]")
        tp, fp, tn, fn = (self._value(s) for s in (self.true_positive, self.false_positive,
                                                   self.true_negative, self.false_negative))
        if self.curve == "PR" and self.summation_method == "interpolation":
            return _interpolated_pr_auc(tp, fp, fn)
        recall = divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = divide_no_nan(fp, fp + tn), recall
        else:
            x, y = recall, divide_no_nan(tp, tp + fp)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / 2
        elif self.summation_method == "minoring":
            heights = torch.minimum(y[:-1], y[1:])
        else:
            heights = torch.maximum(y[:-1], y[1:])
        return float(((x[:-1] - x[1:]) * heights).sum())


def _interpolated_pr_auc(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor) -> float:
    """The PR area with precision interpolated between thresholds as Davis & Goadrich (2006):
    between thresholds A and B, TP and P = TP + FP vary linearly, so precision is
    ``(TP_A + slope (P - P_A)) / P`` and its integral over P is closed-form
    (``slope (dTP + intercept log(P_B / P_A))``), divided by the positives."""
    p = tp + fp
    dtp, dp = tp[:-1] - tp[1:], p[:-1] - p[1:]
    slope = divide_no_nan(dtp, dp.clamp(min=0))
    intercept = tp[1:] - slope * p[1:]
    both = (p[:-1] > 0) & (p[1:] > 0)
    ratio = torch.where(both, divide_no_nan(p[:-1], p[1:].clamp(min=0)), torch.ones_like(p[1:]))
    area = divide_no_nan(slope * (dtp + intercept * torch.log(ratio)),
                         (tp[1:] + fn[1:]).clamp(min=0))
    return float(area.sum())
