"""Accuracy, mean and perplexity."""

from __future__ import annotations

import math

import torch

from cstream.metrics.metric import _ACC, Metric, as_tensor, check_same_shape, weights_like


class AccuracyMetric(Metric):
    """Weighted fraction of ``predictions`` equal to ``labels``:
    ``sum(weights * (labels == predictions)) / sum(weights)``.

    ``update(labels, predictions, weights=None)``: ``labels`` and ``predictions`` have the same
    shape (pass ``logits.argmax(-1)``, not logits); ``weights`` broadcasts to it (use 0 to mask
    padding; with 0/1 weights this is the accuracy over the unmasked entries).

    >>> import torch, cstream
    >>> acc = cstream.metrics.AccuracyMetric("accuracy")
    >>> acc(labels=torch.tensor([1, 2, 3]), predictions=torch.tensor([1, 2, 0]))
    >>> round(float(acc), 4)
    0.6667
    """

    def reset(self):
        self.register_state("total_correct_predictions", torch.zeros((), dtype=_ACC))
        self.register_state("total_num_tokens", torch.zeros((), dtype=_ACC))

    def update(self, labels, predictions, weights=None):
        labels = as_tensor(self, "labels", labels)
        predictions = as_tensor(self, "predictions", predictions)
        check_same_shape(self, "labels", labels, "predictions", predictions,
                         "they must have the same shape (one predicted class per label; pass "
                         "logits.argmax(-1), not the logits).")
        w = weights_like(self, weights, labels)
        correct = (labels == predictions).to(_ACC)
        self.total_correct_predictions.add_((correct * w).sum())
        self.total_num_tokens.add_(w.sum())

    def compute(self) -> float:
        total = float(self.total_num_tokens)
        if total == 0:
            return self._no_data("no samples (or only samples of weight 0) were seen")
        return float(self.total_correct_predictions) / total


class MeanMetric(Metric):
    """Weighted mean of every value passed to ``update(value, weights=None)``:
    ``sum(weights * value) / sum(weights)`` over all updates (``weights`` broadcasts to
    ``value``).

    >>> import torch, cstream
    >>> mean = cstream.metrics.MeanMetric("loss")
    >>> mean(torch.tensor([1.0, 2.0])); mean(torch.tensor(6.0))
    >>> float(mean)
    3.0
    """

    def reset(self):
        self.register_state("total", torch.zeros((), dtype=_ACC))
        self.register_state("count", torch.zeros((), dtype=_ACC))

    def update(self, value, weights=None):
        value = as_tensor(self, "value", value)
        w = weights_like(self, weights, value, "value")
        self.total.add_((value.to(_ACC) * w).sum())
        self.count.add_(w.sum())

    def compute(self) -> float:
        count = float(self.count)
        if count == 0:
            return self._no_data("no values (or only values of weight 0) were seen")
        return float(self.total) / count


class PerplexityMetric(Metric):
    """``exp(total loss / total tokens)`` over all updates.

    ``update(labels, loss, weights=None)``: ``loss`` is the batch's loss *summed* over its
    tokens (a scalar), as in Cerebras' model zoo (for a mean-reduced cross entropy pass
    ``loss * num_tokens``); the batch's tokens are ``labels.numel()``, or the number of nonzero
    ``weights`` (which must have the labels' shape) when given.

    >>> import math, torch, cstream
    >>> ppl = cstream.metrics.PerplexityMetric("perplexity")
    >>> ppl(labels=torch.zeros(2, 3, dtype=torch.long), loss=torch.tensor(6 * math.log(4.0)))
    >>> round(float(ppl), 6)
    4.0
    """

    def reset(self):
        self.register_state("total_loss", torch.zeros((), dtype=_ACC))
        self.register_state("total_num_tokens", torch.zeros((), dtype=_ACC))

    def update(self, labels, loss, weights=None):
        labels = as_tensor(self, "labels", labels)
        loss = as_tensor(self, "loss", loss)
        if loss.numel() != 1:
            raise ValueError(
                f"PerplexityMetric {self.name!r}: loss has shape {tuple(loss.shape)}; it must be "
                "the batch's loss summed over its tokens (one number). Pass loss.sum() for "
                "per-token losses."
            )
        if weights is None:
            tokens = torch.full((), labels.numel(), dtype=_ACC, device=labels.device)
        else:
            w = as_tensor(self, "weights", weights)
            check_same_shape(self, "labels", labels, "weights", w,
                             "weights mark the labels that count as tokens (0 = padding), so "
                             "they must have the labels' shape.")
            tokens = (w != 0).to(_ACC).sum()
        self.total_loss.add_(loss.reshape(()).to(_ACC))
        self.total_num_tokens.add_(tokens)

    def compute(self) -> float:
        tokens = float(self.total_num_tokens)
        if tokens == 0:
            return self._no_data("no tokens were seen")
        return math.exp(float(self.total_loss) / tokens)
