"""Metrics of multi-class predictions from per-class counts: F-beta, mean IOU, Dice (from a
weighted confusion matrix) and mean per-class accuracy.

Labels or predictions outside ``[0, num_classes)`` cannot be checked inside the traced step
(that would read a value): those samples are left out and counted (samples of weight 0 are not
counted), and ``compute`` warns how many there were.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from cstream.metrics.metric import (
    _ACC,
    Metric,
    as_tensor,
    check_same_shape,
    class_ids,
    divide_no_nan,
    name_first_also,
    warn_out_of_range,
)
from workers.checks import positive_number

_SAME_SHAPE = ("they must have the same shape (one predicted class id per label; pass "
               "logits.argmax(-1), not the logits).")


def _check_num_classes(kind: str, num_classes, least: int) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < least:
        raise ValueError(f"{kind}: num_classes must be an int >= {least}, got {num_classes!r}.")


def _weights(metric: Metric, weights, labels: torch.Tensor) -> torch.Tensor | None:
    """``weights`` (same shape as ``labels``) flattened, as float64; None stays None (a tensor
    of ones made inside the step would be a constant, which inductor's compile mishandles)."""
    if weights is None:
        return None
    weights = as_tensor(metric, "weights", weights)
    check_same_shape(metric, "labels", labels, "weights", weights,
                     "weights must have the labels' shape (one weight per label, 0 masks it).")
    return weights.reshape(-1).to(_ACC)


def _class_pairs(metric, labels, predictions, weights):
    """``(weights or None, label ids, prediction ids)``, flat, after the checks every
    class-counting metric makes of its inputs."""
    labels = as_tensor(metric, "labels", labels)
    predictions = as_tensor(metric, "predictions", predictions)
    check_same_shape(metric, "labels", labels, "predictions", predictions, _SAME_SHAPE)
    w = _weights(metric, weights, labels)
    y = class_ids(metric, "labels", labels).reshape(-1)
    p = class_ids(metric, "predictions", predictions).reshape(-1)
    return w, y, p


class _ConfusionMatrixMetric(Metric):
    """Accumulates ``confusion_matrix[label, prediction] += weight`` (rows: labels)."""

    _ignore_arg = "ignore_classes"
    _least_classes = 1

    def _setup(self, num_classes: int, ignore: Iterable[int] | None) -> None:
        kind = type(self).__name__
        _check_num_classes(kind, num_classes, self._least_classes)
        self.num_classes = num_classes
        if isinstance(ignore, int) and not isinstance(ignore, bool):
            ignore = [ignore]
        ignore = list(ignore or ())
        bad = [c for c in ignore if isinstance(c, bool) or not isinstance(c, int)
               or not 0 <= c < num_classes]
        if bad:
            raise ValueError(f"{kind}: {self._ignore_arg}={ignore!r} holds {bad!r}, not class ids "
                             f"in [0, {num_classes}).")
        self.ignored = sorted(set(ignore))
        if len(self.ignored) == num_classes:
            raise ValueError(f"{kind}: {self._ignore_arg}={ignore!r} ignores every class; "
                             "nothing would be measured.")

    def reset(self):
        k = self.num_classes
        self.register_state("confusion_matrix", torch.zeros((k, k), dtype=_ACC))
        self.register_state("labels_out_of_range", torch.zeros((), dtype=_ACC))
        self.register_state("predictions_out_of_range", torch.zeros((), dtype=_ACC))

    def _accumulate(self, labels, predictions, weights, dtype) -> None:
        w, y, p = _class_pairs(self, labels, predictions, weights)
        k = self.num_classes
        y_ok = (y >= 0) & (y < k)
        p_ok = (p >= 0) & (p < k)
        counted = 1.0 if w is None else (w != 0).to(_ACC)
        self.labels_out_of_range.add_(((~y_ok).to(_ACC) * counted).sum())
        self.predictions_out_of_range.add_(((~p_ok).to(_ACC) * counted).sum())
        keep = y_ok & p_ok
        src = keep.to(_ACC) if w is None else torch.where(keep, w, torch.zeros_like(w))
        y, p = torch.where(keep, y, torch.zeros_like(y)), torch.where(keep, p, torch.zeros_like(p))
        # straight into the state: a scatter into a tensor made inside the step breaks
        # inductor's compile of the step
        self.confusion_matrix.index_put_((y, p), src, accumulate=True)
        self._dtype = dtype

    def _matrix(self) -> torch.Tensor:
        """The accumulated matrix (warns about out-of-range samples)."""
        k = self.num_classes
        warn_out_of_range(self, float(self.labels_out_of_range), "labels were",
                          f"[0, {k}) (num_classes={k})")
        warn_out_of_range(self, float(self.predictions_out_of_range), "predictions were",
                          f"[0, {k}) (num_classes={k})")
        return self._value(self.confusion_matrix)

    def _mask(self) -> torch.Tensor:
        """1.0 for the classes measured, 0.0 for the ignored ones."""
        mask = torch.ones(self.num_classes, dtype=_ACC)
        mask[self.ignored] = 0.0
        return mask


class FBetaScoreMetric(_ConfusionMatrixMetric):
    """F-beta score ``(1 + beta^2) P R / (beta^2 P + R)`` of multi-class predictions.

    ``average_type="micro"`` computes P and R from the counts summed over the classes not in
    ``ignore_labels``; ``"macro"`` averages the per-class scores over those classes (a class
    with no predictions or no labels scores 0). A sample whose label is ignored still counts as
    a false positive of the class it was predicted as (as scikit-learn's ``labels=``).
    ``update(labels, predictions, dtype=None)`` takes class ids of the same shape;
    ``compute()`` returns a 0-d float32 tensor (or of the ``dtype`` given).

    >>> import torch, cstream
    >>> f1 = cstream.metrics.FBetaScoreMetric(3, average_type="macro", name="f1")
    >>> f1(labels=torch.tensor([0, 1, 2, 2]), predictions=torch.tensor([0, 2, 2, 2]))
    >>> round(float(f1), 4)
    0.6
    """

    _ignore_arg = "ignore_labels"
    _least_classes = 2

    @name_first_also
    def __init__(self, num_classes: int, beta: float = 1.0, average_type: str = "micro",
                 ignore_labels: Iterable[int] | None = None, name: str | None = None, *,
                 compute_on_system: bool | None = None):
        if average_type not in ("micro", "macro"):
            raise ValueError(f"FBetaScoreMetric: average_type must be 'micro' or 'macro', got "
                             f"{average_type!r}.")
        self.beta = positive_number(beta, "FBetaScoreMetric: beta")
        self.average_type = average_type
        self._setup(num_classes, ignore_labels)
        super().__init__(name, compute_on_system=compute_on_system)

    def update(self, labels, predictions, dtype=None):
        self._accumulate(labels, predictions, None, dtype)

    def compute(self) -> torch.Tensor:
        cm, mask = self._matrix(), self._mask()
        tp, predicted, actual = cm.diagonal(), cm.sum(0), cm.sum(1)
        b2 = self.beta ** 2
        if self.average_type == "micro":
            tp, predicted, actual = (tp * mask).sum(), (predicted * mask).sum(), \
                (actual * mask).sum()
        precision, recall = divide_no_nan(tp, predicted), divide_no_nan(tp, actual)
        f = divide_no_nan((1 + b2) * precision * recall, b2 * precision + recall)
        if self.average_type == "macro":
            f = (f * mask).sum() / mask.sum()
        return self._result(f)


class _PerClassMeanMetric(_ConfusionMatrixMetric):
    """Mean over the classes that are not ignored and occur (denominator > 0); 0 if none."""

    @name_first_also
    def __init__(self, num_classes: int, ignore_classes: Iterable[int] | None = None,
                 name: str | None = None, *, compute_on_system: bool | None = None):
        self._setup(num_classes, ignore_classes)
        super().__init__(name, compute_on_system=compute_on_system)

    def update(self, labels, predictions, weights=None, dtype=None):
        """Accumulate a batch: ``labels`` and ``predictions`` are class ids of the same shape;
        ``weights`` (optional) has that shape too, 0 masks an entry."""
        self._accumulate(labels, predictions, weights, dtype)

    def _per_class(self, cm: torch.Tensor):  # -> (numerator, denominator)
        raise NotImplementedError

    def compute(self) -> torch.Tensor:
        num, den = self._per_class(self._matrix())
        present = ((den > 0) & (self._mask() > 0)).to(_ACC)
        count = present.sum()
        value = (divide_no_nan(num, den) * present).sum() / count if count else count
        return self._result(value)


class MeanIOUMetric(_PerClassMeanMetric):
    """Mean over classes of the intersection over union ``TP / (TP + FP + FN)``.

    The mean runs over the classes that occur in the labels or the predictions and are not in
    ``ignore_classes`` (0 when there is none). ``update(labels, predictions, weights=None,
    dtype=None)`` takes class ids of the same shape (e.g. segmentation maps); ``compute()``
    returns a 0-d float32 tensor (or of the ``dtype`` given).

    >>> import torch, cstream
    >>> miou = cstream.metrics.MeanIOUMetric(2, name="miou")
    >>> miou(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0, 1, 1, 1]))
    >>> round(float(miou), 4)
    0.5833
    """

    def _per_class(self, cm):
        tp = cm.diagonal()
        return tp, cm.sum(0) + cm.sum(1) - tp


class DiceCoefficientMetric(_PerClassMeanMetric):
    """Mean over classes of the Dice coefficient ``2 TP / (2 TP + FP + FN)``.

    The mean runs over the classes that occur in the labels or the predictions and are not in
    ``ignore_classes`` (0 when there is none). Arguments as :class:`MeanIOUMetric`.

    >>> import torch, cstream
    >>> dice = cstream.metrics.DiceCoefficientMetric(2, name="dice")
    >>> dice(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0, 1, 1, 1]))
    >>> round(float(dice), 4)
    0.7333
    """

    def _per_class(self, cm):
        return 2 * cm.diagonal(), cm.sum(0) + cm.sum(1)


class MeanPerClassAccuracyMetric(Metric):
    """Mean over all ``num_classes`` classes of the per-class accuracy (the recall of each
    class); a class that never occurs in the labels counts as 0, as cerebras.pytorch.

    ``update(labels, predictions, weights=None, dtype=None)`` takes class ids of the same
    shape, ``weights`` of that shape too. Labels outside ``[0, num_classes)`` are left out and
    counted (``compute`` warns); a prediction outside it is a wrong prediction.
    ``compute()`` returns a 0-d float32 tensor (or of the ``dtype`` given).

    >>> import torch, cstream
    >>> mpca = cstream.metrics.MeanPerClassAccuracyMetric(2, name="mpca")
    >>> mpca(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0, 1, 1, 2]))
    >>> float(mpca)
    0.5
    """

    @name_first_also
    def __init__(self, num_classes: int, name: str | None = None, *,
                 compute_on_system: bool | None = None):
        _check_num_classes(type(self).__name__, num_classes, 1)
        self.num_classes = num_classes
        super().__init__(name, compute_on_system=compute_on_system)

    def reset(self):
        k = self.num_classes
        self.register_state("total_per_class_correct_predictions", torch.zeros(k, dtype=_ACC))
        self.register_state("total_per_class_tokens", torch.zeros(k, dtype=_ACC))
        self.register_state("labels_out_of_range", torch.zeros((), dtype=_ACC))

    def update(self, labels, predictions, weights=None, dtype=None):
        w, y, p = _class_pairs(self, labels, predictions, weights)
        k = self.num_classes
        y_ok = (y >= 0) & (y < k)
        counted = 1.0 if w is None else (w != 0).to(_ACC)
        self.labels_out_of_range.add_(((~y_ok).to(_ACC) * counted).sum())
        w = y_ok.to(_ACC) if w is None else torch.where(y_ok, w, torch.zeros_like(w))
        y = torch.where(y_ok, y, torch.zeros_like(y))
        correct = (y == p).to(_ACC) * w
        self.total_per_class_correct_predictions.scatter_add_(0, y, correct)
        self.total_per_class_tokens.scatter_add_(0, y, w)
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        k = self.num_classes
        warn_out_of_range(self, float(self.labels_out_of_range), "labels were",
                          f"[0, {k}) (num_classes={k})")
        per_class = divide_no_nan(self._value(self.total_per_class_correct_predictions),
                                  self._value(self.total_per_class_tokens))
        return self._result(per_class.mean())
