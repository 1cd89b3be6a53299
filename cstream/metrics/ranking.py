"""Precision@K and Recall@K over the top-k scored classes."""

from __future__ import annotations

import math

import torch

from cstream.metrics.metric import _ACC, Metric, as_tensor, class_ids, name_first_also
from workers.checks import positive_int


class _AtKMetric(Metric):
    """Counts the (weighted) hits among the top ``k`` classes and the misses
    :meth:`_misses` says, in the state :attr:`_miss_state` names."""

    _miss_state = ""  # false_positive_at_k or false_negative_at_k

    @name_first_also
    def __init__(self, k: int, name: str | None = None, *,
                 compute_on_system: bool | None = None):
        self.k = positive_int(k, f"{type(self).__name__}: k")
        super().__init__(name, compute_on_system=compute_on_system)

    def reset(self):
        self.register_state("true_positive_at_k", torch.zeros((), dtype=_ACC))
        self.register_state(self._miss_state, torch.zeros((), dtype=_ACC))

    def _hits(self, labels, predictions, weights):
        """Per-sample count of (label, top-k class) pairs that match, the labels per sample,
        and the per-sample weights."""
        labels = as_tensor(self, "labels", labels)
        predictions = as_tensor(self, "predictions", predictions)
        kind = f"{type(self).__name__} {self.name!r}"
        if predictions.dim() != 2:
            raise ValueError(f"{kind}: predictions has shape {tuple(predictions.shape)}; it must "
                             "be (batch_size, num_classes) scores (logits or probabilities).")
        if labels.dim() == 1:
            labels = labels[:, None]
        if labels.dim() != 2 or labels.shape[0] != predictions.shape[0]:
            raise ValueError(
                f"{kind}: labels has shape {tuple(labels.shape)} and predictions has shape "
                f"{tuple(predictions.shape)}; labels must be (batch_size,) or (batch_size, "
                "num_labels) class ids with the same batch_size as predictions."
            )
        num_classes = predictions.shape[1]
        if self.k > num_classes:
            raise ValueError(f"{kind}: k={self.k} but predictions score only {num_classes} "
                             "classes; k must be at most num_classes.")
        batch = labels.shape[0]
        w = 1.0  # no tensor of ones: a constant made in the step trips inductor's compile
        if weights is not None:
            w = as_tensor(self, "weights", weights)
            if w.numel() != 1 and w.numel() != batch:
                raise ValueError(f"{kind}: weights has shape {tuple(w.shape)}; it must be a "
                                 f"scalar or one weight per sample, shape ({batch},).")
            w = w.to(_ACC).reshape(-1).expand(batch)
        y = class_ids(self, "labels", labels)
        top = torch.topk(predictions, self.k, dim=-1).indices  # (batch, k)
        pairs = (y[:, :, None] == top[:, None, :]).to(_ACC).sum((1, 2))
        return pairs, labels.shape[1], w

    def _misses(self, hits, num_labels):
        """Each sample's misses from its ``hits`` and number of labels."""
        raise NotImplementedError

    def update(self, labels, predictions, weights=None):
        hits, num_labels, w = self._hits(labels, predictions, weights)
        self.true_positive_at_k.add_((hits * w).sum())
        getattr(self, self._miss_state).add_((self._misses(hits, num_labels) * w).sum())

    def compute(self) -> float:
        tp, miss = float(self.true_positive_at_k), float(getattr(self, self._miss_state))
        value = tp / (tp + miss) if tp + miss else math.nan
        return self._warn_nan(value, "no sample (of nonzero weight) was seen")


class PrecisionAtKMetric(_AtKMetric):
    """Precision@K: of the ``k`` highest-scored classes of each sample, the (weighted) fraction
    that are among its labels: ``sum(w * hits) / sum(w * k)``.

    ``update(labels, predictions, weights=None)``: ``predictions`` are scores of shape
    ``(batch_size, num_classes)`` (the top k are taken inside); ``labels`` are the relevant
    class ids, ``(batch_size, num_labels)`` or ``(batch_size,)``; ``weights`` is a scalar or
    one weight per sample. A label id that occurs twice in a row counts twice, as
    cerebras.pytorch. ``compute()`` returns a Python float; nan before any sample.

    >>> import torch, cstream
    >>> p = cstream.metrics.PrecisionAtKMetric(2, name="p@2")
    >>> p(labels=torch.tensor([[0, 3]]), predictions=torch.tensor([[0.9, 0.8, 0.1, 0.2]]))
    >>> float(p)
    0.5
    """

    _miss_state = "false_positive_at_k"

    def _misses(self, hits, num_labels):
        return self.k - hits  # top-k classes that are no label


class RecallAtKMetric(_AtKMetric):
    """Recall@K: of each sample's labels, the (weighted) fraction found among its ``k``
    highest-scored classes: ``sum(w * hits) / sum(w * num_labels)``.

    Arguments as :class:`PrecisionAtKMetric`; every column of ``labels`` counts as a label
    (a padding id that is no class is a label never found), as cerebras.pytorch.

    >>> import torch, cstream
    >>> r = cstream.metrics.RecallAtKMetric(1, name="r@1")
    >>> r(labels=torch.tensor([[0, 3]]), predictions=torch.tensor([[0.9, 0.8, 0.1, 0.2]]))
    >>> float(r)
    0.5
    """

    _miss_state = "false_negative_at_k"

    def _misses(self, hits, num_labels):
        return num_labels - hits  # labels not among the top k
