"""Precision@K and Recall@K over the top-k scored classes."""

from __future__ import annotations

import torch

from cstream.metrics.metric import _ACC, Metric, as_tensor, class_ids, warn_out_of_range


class _AtKMetric(Metric):
    def __init__(self, name: str, k: int, compute_on_system=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"{type(self).__name__}: k must be a positive int, got {k!r}.")
        self.k = k
        super().__init__(name, compute_on_system)

    def reset(self):
        self.register_state("true_positive_at_k", torch.zeros((), dtype=_ACC))
        self.register_state("denominator", torch.zeros((), dtype=_ACC))
        self.register_state("labels_out_of_range", torch.zeros((), dtype=_ACC))

    def _hits(self, labels, predictions, weights):
        """Per-sample hits among the top k, valid labels per sample, and sample weights."""
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
        if weights is None:
            w = torch.ones(batch, dtype=_ACC, device=predictions.device)
        else:
            w = as_tensor(self, "weights", weights)
            if w.numel() != 1 and tuple(w.shape) != (batch,):
                raise ValueError(f"{kind}: weights has shape {tuple(w.shape)}; it must be a "
                                 f"scalar or one weight per sample, shape ({batch},).")
            w = w.to(_ACC).reshape(-1).expand(batch)
        y = class_ids(self, "labels", labels)
        valid = (y >= 0) & (y < num_classes)
        self.labels_out_of_range.add_(((~valid).to(_ACC) * (w[:, None] != 0)).sum())
        top = torch.topk(predictions, self.k, dim=-1).indices  # (batch, k)
        match = (y[:, :, None] == top[:, None, :]).any(-1) & valid  # (batch, num_labels)
        return match.to(_ACC).sum(-1), valid.to(_ACC).sum(-1), w

    def compute(self) -> float:
        warn_out_of_range(self, float(self.labels_out_of_range), "labels were",
                          "[0, num_classes) (num_classes = predictions.shape[-1])")
        den = float(self.denominator)
        if den == 0:
            return self._no_data("no sample (of nonzero weight) was seen")
        return float(self.true_positive_at_k) / den


class PrecisionAtKMetric(_AtKMetric):
    """Precision@K: of the ``k`` highest-scored classes of each sample, the (weighted) fraction
    that are among its labels: ``sum(w * hits) / sum(w * k)``.

    ``update(labels, predictions, weights=None)``: ``predictions`` are scores of shape
    ``(batch_size, num_classes)`` (the top k are taken inside); ``labels`` are the relevant
    class ids, ``(batch_size, num_labels)`` or ``(batch_size,)``; ``weights`` is a scalar or
    one weight per sample. Labels outside ``[0, num_classes)`` are never hits and are counted;
    ``compute`` warns about them.

    >>> import torch, cstream
    >>> p = cstream.metrics.PrecisionAtKMetric("p@2", k=2)
    >>> p(labels=torch.tensor([[0, 3]]), predictions=torch.tensor([[0.9, 0.8, 0.1, 0.2]]))
    >>> float(p)
    0.5
    """

    def update(self, labels, predictions, weights=None):
        hits, _, w = self._hits(labels, predictions, weights)
        self.true_positive_at_k.add_((hits * w).sum())
        self.denominator.add_(w.sum() * self.k)


class RecallAtKMetric(_AtKMetric):
    """Recall@K: of each sample's labels, the (weighted) fraction found among its ``k``
    highest-scored classes: ``sum(w * hits) / sum(w * num_valid_labels)``.

    Arguments as :class:`PrecisionAtKMetric`. Labels outside ``[0, num_classes)`` are left out
    of the denominator and counted; ``compute`` warns about them.

    >>> import torch, cstream
    >>> r = cstream.metrics.RecallAtKMetric("r@1", k=1)
    >>> r(labels=torch.tensor([[0, 3]]), predictions=torch.tensor([[0.9, 0.8, 0.1, 0.2]]))
    >>> float(r)
    0.5
    """

    def update(self, labels, predictions, weights=None):
        hits, relevant, w = self._hits(labels, predictions, weights)
        self.true_positive_at_k.add_((hits * w).sum())
        self.denominator.add_((relevant * w).sum())
