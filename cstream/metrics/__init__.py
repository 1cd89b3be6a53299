"""``cstream.metrics``: evaluation metrics whose ``update`` traces into the static graph.

A metric's state lives in tensors registered with :meth:`Metric.register_state` (state handles
on the CSX backend); ``update`` changes them in place with tensor ops only, so it can run inside
a traced step; ``compute`` (outside the step) turns them into the value.

Labels outside ``[0, num_classes)`` cannot be checked inside a traced step (that would read a
value): they are left out of the result and counted, and ``compute`` warns how many there were.

>>> import torch, cstream
>>> acc = cstream.metrics.AccuracyMetric("accuracy")
>>> acc(labels=torch.tensor([1, 2, 3]), predictions=torch.tensor([1, 2, 0]))
>>> round(float(acc), 4)
0.6667
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from typing import Optional, Sequence

import torch

from cstream.creation import state_tensor


class Metric(torch.nn.Module):
    """Base class: ``Metric(name)``; subclasses implement ``reset``, ``update``, ``compute``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        reset = cls.__dict__.get("reset")
        if reset is not None and not getattr(reset, "__cstream_wrapped__", False):
            def wrapped(self, *a, _reset=reset, **k):
                _reset(self, *a, **k)
                counter = self._buffers.get("_num_updates")
                if counter is not None:
                    with torch.no_grad():
                        counter.zero_()

            wrapped.__cstream_wrapped__ = True
            wrapped.__doc__ = reset.__doc__
            cls.reset = wrapped

    def __init__(self, name: str, compute_on_system: Optional[bool] = None):
        super().__init__()
        if not isinstance(name, str) or not name:
            raise TypeError(f"{type(self).__name__}: name must be a non-empty string, got {name!r}.")
        self.name = name
        self.compute_on_system = compute_on_system
        self._state_names: list[str] = []
        self.register_state("_num_updates", torch.zeros((), dtype=torch.float64))
        self.reset()

    def register_state(self, name: str, tensor: torch.Tensor, persistent: bool = False) -> None:
        """Register (or, when it exists, overwrite in place) a state tensor of the metric."""
        existing = self._buffers.get(name) if hasattr(self, "_buffers") else None
        if existing is not None:
            with torch.no_grad():
                existing.copy_(tensor)
            return
        self.register_buffer(name, state_tensor(tensor.detach().clone()), persistent=persistent)
        self._state_names.append(name)

    @abstractmethod
    def reset(self) -> None:
        """Define (first call) or reset the state tensors."""

    @abstractmethod
    def update(self, *args, **kwargs) -> None:
        """Accumulate a batch into the state, in place, with tensor ops only."""

    @abstractmethod
    def compute(self):
        """The metric's value from the accumulated state."""

    def forward(self, *args, **kwargs):
        with torch.no_grad():
            self.update(*args, **kwargs)
            self._num_updates.add_(1)

    @property
    def num_updates(self) -> int:
        return int(self._num_updates)

    def __float__(self) -> float:
        return float(self.compute())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _weights(weights, like: torch.Tensor) -> torch.Tensor:
    if weights is None:
        return torch.ones(like.shape, dtype=torch.float64)
    w = torch.as_tensor(weights).to(torch.float64)
    try:
        return torch.broadcast_to(w, like.shape)
    except RuntimeError:
        raise ValueError(f"weights of shape {tuple(w.shape)} do not broadcast to the labels' "
                         f"shape {tuple(like.shape)}.") from None


def _same_shape(owner, a_name, a, b_name, b):
    if a.shape != b.shape:
        raise ValueError(f"{owner}: {a_name} has shape {tuple(a.shape)} but {b_name} has shape "
                         f"{tuple(b.shape)}; they must match (one entry per sample).")


class AccuracyMetric(Metric):
    """Fraction of ``predictions`` equal to ``labels`` (weighted)."""

    def reset(self):
        self.register_state("total_correct", torch.zeros((), dtype=torch.float64))
        self.register_state("total_weight", torch.zeros((), dtype=torch.float64))

    def update(self, labels, predictions, weights=None):
        _same_shape(self.name, "labels", labels, "predictions", predictions)
        w = _weights(weights, labels)
        self.total_correct.add_(((labels == predictions).to(torch.float64) * w).sum())
        self.total_weight.add_(w.sum())

    def compute(self):
        return float(self.total_correct / torch.clamp(self.total_weight, min=1e-300))


class MeanMetric(Metric):
    """Weighted mean of every value passed to ``update``."""

    def reset(self):
        self.register_state("total", torch.zeros((), dtype=torch.float64))
        self.register_state("count", torch.zeros((), dtype=torch.float64))

    def update(self, value, weights=None):
        value = torch.as_tensor(value).to(torch.float64)
        w = _weights(weights, value)
        self.total.add_((value * w).sum())
        self.count.add_(w.sum())

    def compute(self):
        return float(self.total / torch.clamp(self.count, min=1e-300))


class PerplexityMetric(Metric):
    """``exp(total loss / total tokens)``; ``loss`` is the batch's mean loss over its (weighted)
    tokens."""

    def reset(self):
        self.register_state("total_loss", torch.zeros((), dtype=torch.float64))
        self.register_state("total_tokens", torch.zeros((), dtype=torch.float64))

    def update(self, labels, loss, weights=None):
        w = _weights(weights, labels)
        tokens = w.sum()
        self.total_loss.add_(torch.as_tensor(loss).to(torch.float64) * tokens)
        self.total_tokens.add_(tokens)

    def compute(self):
        return math.exp(float(self.total_loss / torch.clamp(self.total_tokens, min=1e-300)))


class _ConfusionMetric(Metric):
    """Accumulates a weighted confusion matrix (rows: labels, columns: predictions)."""

    def __init__(self, name: str, num_classes: int, ignore_labels: Optional[Sequence[int]] = None,
                 compute_on_system=None):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"{type(self).__name__}: num_classes must be an int >= 2, got "
                             f"{num_classes!r}.")
        self.num_classes = num_classes
        self.ignore_labels = sorted(set(ignore_labels or ()))
        super().__init__(name, compute_on_system)

    def reset(self):
        k = self.num_classes
        self.register_state("confusion", torch.zeros(k * k, dtype=torch.float64))
        self.register_state("out_of_range", torch.zeros((), dtype=torch.float64))

    def update(self, labels, predictions, weights=None):
        _same_shape(self.name, "labels", labels, "predictions", predictions)
        k = self.num_classes
        labels, predictions = labels.reshape(-1).long(), predictions.reshape(-1).long()
        w = _weights(weights, labels.reshape(-1)) if weights is None else _weights(
            torch.as_tensor(weights).reshape(-1), labels)
        valid = (labels >= 0) & (labels < k) & (predictions >= 0) & (predictions < k)
        keep = valid
        for c in self.ignore_labels:
            keep = keep & (labels != c)
            valid = valid | (labels == c)
        self.out_of_range.add_(((~valid).to(torch.float64) * w).sum())
        index = torch.where(keep, labels * k + predictions, torch.zeros_like(labels))
        self.confusion.scatter_add_(0, index, torch.where(keep, w, torch.zeros_like(w)))

    def matrix(self) -> torch.Tensor:
        bad = float(self.out_of_range)
        if bad:
            warnings.warn(
                f"{self.name}: {bad:g} (weighted) labels or predictions were outside "
                f"[0, {self.num_classes}) and were ignored.", UserWarning, stacklevel=3)
        k = self.num_classes
        cm = self.confusion.to("cpu").reshape(k, k).clone()
        for c in self.ignore_labels:
            if 0 <= c < k:
                cm[c, :] = 0
        return cm


class MeanPerClassAccuracyMetric(_ConfusionMetric):
    """Mean over classes (that occur in the labels) of the per-class accuracy (recall)."""

    def compute(self):
        cm = self.matrix()
        rows = cm.sum(1)
        present = rows > 0
        per_class = torch.diag(cm)[present] / rows[present]
        return float(per_class.mean()) if present.any() else 0.0


class MeanIOUMetric(_ConfusionMetric):
    """Mean over classes of intersection over union ``TP / (TP + FP + FN)``."""

    def compute(self):
        cm = self.matrix()
        tp = torch.diag(cm)
        denom = cm.sum(0) + cm.sum(1) - tp
        present = denom > 0
        return float((tp[present] / denom[present]).mean()) if present.any() else 0.0


class DiceCoefficientMetric(_ConfusionMetric):
    """Mean over classes of ``2 TP / (2 TP + FP + FN)``."""

    def compute(self):
        cm = self.matrix()
        tp = torch.diag(cm)
        denom = cm.sum(0) + cm.sum(1)
        present = denom > 0
        return float((2 * tp[present] / denom[present]).mean()) if present.any() else 0.0


class FBetaScoreMetric(_ConfusionMetric):
    """F-beta score, ``average_type`` "micro" (global counts) or "macro" (mean over classes)."""

    def __init__(self, name, num_classes, beta: float = 1.0, average_type: str = "micro",
                 ignore_labels=None, compute_on_system=None):
        if average_type not in ("micro", "macro"):
            raise ValueError(f"FBetaScoreMetric: average_type must be 'micro' or 'macro', got "
                             f"{average_type!r}.")
        if beta <= 0:
            raise ValueError(f"FBetaScoreMetric: beta must be > 0, got {beta!r}.")
        self.beta, self.average_type = float(beta), average_type
        super().__init__(name, num_classes, ignore_labels, compute_on_system)

    def compute(self):
        cm = self.matrix()
        tp, pred, true = torch.diag(cm), cm.sum(0), cm.sum(1)
        classes = [c for c in range(self.num_classes) if c not in self.ignore_labels]
        tp, pred, true = tp[classes], pred[classes], true[classes]
        b2 = self.beta ** 2
        if self.average_type == "micro":
            p = tp.sum() / pred.sum() if pred.sum() > 0 else torch.tensor(0.0, dtype=cm.dtype)
            r = tp.sum() / true.sum() if true.sum() > 0 else torch.tensor(0.0, dtype=cm.dtype)
            return float((1 + b2) * p * r / (b2 * p + r)) if (p + r) > 0 else 0.0
        p = torch.where(pred > 0, tp / pred.clamp(min=1e-300), torch.zeros_like(tp))
        r = torch.where(true > 0, tp / true.clamp(min=1e-300), torch.zeros_like(tp))
        denom = b2 * p + r
        f = torch.where(denom > 0, (1 + b2) * p * r / denom.clamp(min=1e-300), torch.zeros_like(tp))
        return float(f.mean())


class _AtKMetric(Metric):
    def __init__(self, name: str, k: int, compute_on_system=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{type(self).__name__}: k must be a positive int, got {k!r}.")
        self.k = k
        super().__init__(name, compute_on_system)

    def reset(self):
        self.register_state("total", torch.zeros((), dtype=torch.float64))
        self.register_state("count", torch.zeros((), dtype=torch.float64))

    def _hits(self, labels, predictions):
        """labels: (B, L) relevant ids (-1 pads), predictions: (B, >=k) ranked ids."""
        if labels.dim() == 1:
            labels = labels[:, None]
        if labels.dim() != 2 or predictions.dim() != 2 or labels.shape[0] != predictions.shape[0]:
            raise ValueError(
                f"{self.name}: expected labels (batch, num_relevant) and predictions (batch, k), "
                f"got {tuple(labels.shape)} and {tuple(predictions.shape)}.")
        if predictions.shape[1] < self.k:
            raise ValueError(f"{self.name}: predictions hold {predictions.shape[1]} ranked ids "
                             f"per sample, fewer than k={self.k}.")
        top = predictions[:, :self.k].long()
        labels = labels.long()
        match = (top[:, :, None] == labels[:, None, :]) & (labels[:, None, :] >= 0)
        hits = match.any(-1).to(torch.float64).sum(-1)
        relevant = (labels >= 0).to(torch.float64).sum(-1)
        return hits, relevant

    def compute(self):
        return float(self.total / torch.clamp(self.count, min=1e-300))


class PrecisionAtKMetric(_AtKMetric):
    """Mean over samples of ``|top-k predictions ∩ relevant labels| / k``."""

    def update(self, labels, predictions, weights=None):
        hits, _ = self._hits(labels, predictions)
        w = _weights(weights, hits)
        self.total.add_((hits / self.k * w).sum())
        self.count.add_(w.sum())


class RecallAtKMetric(_AtKMetric):
    """Mean over samples of ``|top-k predictions ∩ relevant labels| / |relevant labels|``."""

    def update(self, labels, predictions, weights=None):
        hits, relevant = self._hits(labels, predictions)
        w = _weights(weights, hits) * (relevant > 0).to(torch.float64)
        self.total.add_((hits / relevant.clamp(min=1) * w).sum())
        self.count.add_(w.sum())


class AUCMetric(Metric):
    """Area under the ROC (or precision-recall, ``curve="PR"``) curve, from true/false positive
    counts at ``num_thresholds`` evenly spaced thresholds (trapezoidal rule)."""

    def __init__(self, name: str, num_thresholds: int = 200, curve: str = "ROC",
                 compute_on_system=None):
        if curve not in ("ROC", "PR"):
            raise ValueError(f"AUCMetric: curve must be 'ROC' or 'PR', got {curve!r}.")
        if num_thresholds < 2:
            raise ValueError(f"AUCMetric: num_thresholds must be >= 2, got {num_thresholds!r}.")
        self.num_thresholds, self.curve = int(num_thresholds), curve
        eps = 1e-7
        inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.thresholds = [-eps] + inner + [1.0 + eps]
        super().__init__(name, compute_on_system)

    def reset(self):
        n = self.num_thresholds
        for s in ("tp", "fp", "tn", "fn"):
            self.register_state(s, torch.zeros(n, dtype=torch.float64))
        self.register_state("out_of_range", torch.zeros((), dtype=torch.float64))

    def update(self, labels, predictions, weights=None):
        _same_shape(self.name, "labels", labels, "predictions", predictions)
        labels = labels.reshape(-1).to(torch.float64)
        preds = predictions.reshape(-1).to(torch.float64)
        w = _weights(weights, labels.reshape(-1)) if weights is None else _weights(
            torch.as_tensor(weights).reshape(-1), labels)
        ok = ((labels == 0) | (labels == 1)) & (preds >= 0) & (preds <= 1)
        self.out_of_range.add_(((~ok).to(torch.float64) * w).sum())
        w = torch.where(ok, w, torch.zeros_like(w))
        thr = torch.tensor(self.thresholds, dtype=torch.float64)
        above = (preds[None, :] > thr[:, None]).to(torch.float64)
        pos, neg = labels * w, (1 - labels) * w
        self.tp.add_((above * pos).sum(1))
        self.fp.add_((above * neg).sum(1))
        self.fn.add_(((1 - above) * pos).sum(1))
        self.tn.add_(((1 - above) * neg).sum(1))

    def compute(self):
        bad = float(self.out_of_range)
        if bad:
            warnings.warn(f"{self.name}: {bad:g} (weighted) samples had a label not in {{0, 1}} "
                          "or a prediction outside [0, 1] and were ignored.", UserWarning,
                          stacklevel=2)
        tp, fp, tn, fn = (getattr(self, s).to("cpu") for s in ("tp", "fp", "tn", "fn"))
        eps = 1e-12
        if self.curve == "ROC":
            x = fp / (fp + tn + eps)
            y = tp / (tp + fn + eps)
        else:
            x = tp / (tp + fn + eps)
            y = tp / (tp + fp + eps)
        return float(((x[:-1] - x[1:]) * (y[:-1] + y[1:]) / 2).sum())


__all__ = [
    "AUCMetric", "AccuracyMetric", "DiceCoefficientMetric", "FBetaScoreMetric", "MeanIOUMetric",
    "MeanMetric", "MeanPerClassAccuracyMetric", "Metric", "PerplexityMetric",
    "PrecisionAtKMetric", "RecallAtKMetric",
]
