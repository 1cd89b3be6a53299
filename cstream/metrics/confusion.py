"""Metrics computed from a weighted confusion matrix: F-beta, mean IOU, Dice, mean per-class
accuracy.

Labels or predictions outside ``[0, num_classes)`` cannot be checked inside the traced step
(that would read a value): those samples are left out of the matrix and counted (samples of
weight 0 are not counted), and ``compute`` warns how many there were.
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
    warn_out_of_range,
    weights_like,
)


class _ConfusionMatrixMetric(Metric):
    """Accumulates ``confusion_matrix[label, prediction] += weight`` (rows: labels)."""

    _ignore_arg = "ignore_classes"

    def __init__(self, name: str, num_classes: int, ignore: Iterable[int] | None = None,
                 compute_on_system=None):
        kind = type(self).__name__
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"{kind}: num_classes must be an int >= 2, got {num_classes!r}.")
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
        super().__init__(name, compute_on_system)

    def reset(self):
        k = self.num_classes
        self.register_state("confusion_matrix", torch.zeros((k, k), dtype=_ACC))
        self.register_state("labels_out_of_range", torch.zeros((), dtype=_ACC))
        self.register_state("predictions_out_of_range", torch.zeros((), dtype=_ACC))

    def update(self, labels, predictions, weights=None):
        """Accumulate a batch: ``labels`` and ``predictions`` are integer class ids of the same
        shape; ``weights`` (optional) broadcasts to it, 0 masks an entry."""
        labels = as_tensor(self, "labels", labels)
        predictions = as_tensor(self, "predictions", predictions)
        check_same_shape(self, "labels", labels, "predictions", predictions,
                         "they must have the same shape (one predicted class id per label; "
                         "pass logits.argmax(-1), not the logits).")
        w = weights_like(self, weights, labels).reshape(-1)
        y = class_ids(self, "labels", labels).reshape(-1)
        p = class_ids(self, "predictions", predictions).reshape(-1)
        k = self.num_classes
        y_ok = (y >= 0) & (y < k)
        p_ok = (p >= 0) & (p < k)
        counted = (w != 0).to(_ACC)
        self.labels_out_of_range.add_(((~y_ok).to(_ACC) * counted).sum())
        self.predictions_out_of_range.add_(((~p_ok).to(_ACC) * counted).sum())
        keep = y_ok & p_ok
        index = torch.where(keep, y * k + p, torch.zeros_like(y))
        src = torch.where(keep, w, torch.zeros_like(w))
        batch = torch.zeros(k * k, dtype=_ACC, device=w.device).scatter_add_(0, index, src)
        self.confusion_matrix.add_(batch.reshape(k, k))

    def _matrix(self) -> torch.Tensor:
        """The accumulated matrix (warns about out-of-range samples)."""
        k = self.num_classes
        warn_out_of_range(self, float(self.labels_out_of_range), "labels were",
                          f"[0, {k}) (num_classes={k})")
        warn_out_of_range(self, float(self.predictions_out_of_range), "predictions were",
                          f"[0, {k}) (num_classes={k})")
        return self._value(self.confusion_matrix)

    def _mask(self) -> torch.Tensor:
        mask = torch.ones(self.num_classes, dtype=torch.bool)
        mask[self.ignored] = False
        return mask


class FBetaScoreMetric(_ConfusionMatrixMetric):
    """F-beta score ``(1 + beta^2) P R / (beta^2 P + R)`` of multi-class predictions.

    ``average_type="micro"`` computes P and R from the counts summed over the classes not in
    ``ignore_labels``; ``"macro"`` averages the per-class scores over those classes (a class
    with no predictions or no labels scores 0). A sample whose label is ignored still counts as
    a false positive of the class it was predicted as (as scikit-learn's ``labels=``).
    ``update(labels, predictions, weights=None)`` takes class ids of the same shape.

    >>> import torch, cstream
    >>> f1 = cstream.metrics.FBetaScoreMetric("f1", num_classes=3, average_type="macro")
    >>> f1(labels=torch.tensor([0, 1, 2, 2]), predictions=torch.tensor([0, 2, 2, 2]))
    >>> round(float(f1), 4)
    0.6
    """

    _ignore_arg = "ignore_labels"

    def __init__(self, name: str, num_classes: int, beta: float = 1.0,
                 average_type: str = "micro", ignore_labels: Iterable[int] | None = None,
                 compute_on_system=None):
        if average_type not in ("micro", "macro"):
            raise ValueError(f"FBetaScoreMetric: average_type must be 'micro' or 'macro', got "
                             f"{average_type!r}.")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
            raise ValueError(f"FBetaScoreMetric: beta must be a positive number, got {beta!r}.")
        self.beta = float(beta)
        self.average_type = average_type
        super().__init__(name, num_classes, ignore_labels, compute_on_system)

    def compute(self) -> float:
        cm = self._matrix()
        mask = self._mask()
        tp, predicted, actual = cm.diagonal()[mask], cm.sum(0)[mask], cm.sum(1)[mask]
        b2 = self.beta ** 2
        if self.average_type == "micro":
            tp, predicted, actual = tp.sum(), predicted.sum(), actual.sum()
        precision = torch.where(predicted > 0, tp / predicted, torch.zeros_like(tp))
        recall = torch.where(actual > 0, tp / actual, torch.zeros_like(tp))
        denom = b2 * precision + recall
        f = torch.where(denom > 0, (1 + b2) * precision * recall / denom, torch.zeros_like(tp))
        return float(f.mean())


class _PerClassMeanMetric(_ConfusionMatrixMetric):
    """Mean over the classes that are not ignored and occur (denominator > 0)."""

    def __init__(self, name: str, num_classes: int,
                 ignore_classes: Iterable[int] | None = None, compute_on_system=None):
        super().__init__(name, num_classes, ignore_classes, compute_on_system)

    def _per_class(self, cm: torch.Tensor):  # -> (numerator, denominator)
        raise NotImplementedError

    def compute(self) -> float:
        num, den = self._per_class(self._matrix())
        present = (den > 0) & self._mask()
        if not bool(present.any()):
            return self._no_data("no sample of a measured class was seen")
        return float((num[present] / den[present]).mean())


class MeanIOUMetric(_PerClassMeanMetric):
    """Mean over classes of the intersection over union ``TP / (TP + FP + FN)``.

    The mean runs over the classes that occur in the labels or the predictions and are not in
    ``ignore_classes``. ``update(labels, predictions, weights=None)`` takes class ids of the
    same shape (e.g. segmentation maps).

    >>> import torch, cstream
    >>> miou = cstream.metrics.MeanIOUMetric("miou", num_classes=2)
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
    ``ignore_classes``. ``update(labels, predictions, weights=None)`` takes class ids of the
    same shape.

    >>> import torch, cstream
    >>> dice = cstream.metrics.DiceCoefficientMetric("dice", num_classes=2)
    >>> dice(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0, 1, 1, 1]))
    >>> round(float(dice), 4)
    0.7333
    """

    def _per_class(self, cm):
        return 2 * cm.diagonal(), cm.sum(0) + cm.sum(1)


class MeanPerClassAccuracyMetric(_PerClassMeanMetric):
    """Mean over classes of the per-class accuracy (the recall of each class), also called
    balanced accuracy.

    The mean runs over the classes that occur in the labels and are not in ``ignore_classes``
    (a class that never occurs has no accuracy). ``update(labels, predictions, weights=None)``
    takes class ids of the same shape.

    >>> import torch, cstream
    >>> mpca = cstream.metrics.MeanPerClassAccuracyMetric("mpca", num_classes=3)
    >>> mpca(labels=torch.tensor([0, 0, 1, 1]), predictions=torch.tensor([0, 1, 1, 2]))
    >>> float(mpca)
    0.5
    """

    def _per_class(self, cm):
        return cm.diagonal(), cm.sum(1)
