"""Accuracy, mean and perplexity."""

from __future__ import annotations

import warnings

import torch

from cstream.metrics.metric import _ACC, Metric, as_tensor


class AccuracyMetric(Metric):
    """Fraction of ``predictions`` equal to ``labels``.

    ``update(labels, predictions, weights=None, dtype=None)``: ``labels`` and ``predictions``
    have the same shape (pass ``logits.argmax(-1)``, not logits; a prediction of another shape
    with as many entries is reshaped to the labels', with a warning). With ``weights`` the
    value is ``sum(weights * correct) / count(weights > 0)``, as cerebras.pytorch: with 0/1
    weights (a padding mask) that is the accuracy over the unmasked entries. ``compute()``
    returns a 0-d float32 tensor (or of the ``dtype`` given to ``update``); nan before any
    sample.

    >>> import torch, cstream
    >>> acc = cstream.metrics.AccuracyMetric("accuracy")
    >>> acc(labels=torch.tensor([1, 2, 3]), predictions=torch.tensor([1, 2, 0]))
    >>> round(float(acc), 4)
    0.6667
    """

    def reset(self):
        self.register_state("total_correct_predictions", torch.zeros((), dtype=_ACC))
        self.register_state("total_num_tokens", torch.zeros((), dtype=_ACC))

    def update(self, labels, predictions, weights=None, dtype=None):
        labels = as_tensor(self, "labels", labels)
        predictions = as_tensor(self, "predictions", predictions)
        if labels.shape != predictions.shape:
            if labels.numel() != predictions.numel():
                raise ValueError(
                    f"AccuracyMetric {self.name!r}: labels has shape {tuple(labels.shape)} but "
                    f"predictions has shape {tuple(predictions.shape)}; they must have the same "
                    "shape (one predicted class per label; pass logits.argmax(-1), not the "
                    "logits).")
            warnings.warn(f"AccuracyMetric {self.name!r}: labels has shape "
                          f"{tuple(labels.shape)} and predictions {tuple(predictions.shape)}; "
                          "predictions were reshaped to the labels' shape.", UserWarning,
                          stacklevel=3)
            predictions = predictions.reshape(labels.shape)
        correct = (labels == predictions).to(_ACC)
        # a count known at trace time is added as a Python number (a tensor made from it inside
        # the step would be a constant, which inductor's compile mishandles)
        tokens = correct.numel()
        if weights is not None:
            weights = as_tensor(self, "weights", weights)
            correct = correct * weights.to(_ACC)
            tokens = (weights > 0).to(_ACC).sum()
        self.total_correct_predictions.add_(correct.sum())
        self.total_num_tokens.add_(tokens)
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        value = self._value(self.total_correct_predictions) / self._value(self.total_num_tokens)
        return self._warn_nan(self._result(value),
                              "no samples (or only samples of weight 0) were seen")


class MeanMetric(Metric):
    """Weighted mean of every value passed to ``update(value, weight=1.0, dtype=None)``:
    ``sum(weight * value) / sum(weight)`` over all updates (``weight`` broadcasts to ``value``;
    either may be a tensor or a number). ``compute()`` returns a 0-d float32 tensor (or of the
    ``dtype`` given); nan before any value.

    >>> import torch, cstream
    >>> mean = cstream.metrics.MeanMetric("loss")
    >>> mean(torch.tensor([1.0, 2.0])); mean(torch.tensor(6.0))
    >>> float(mean)
    3.0
    """

    def reset(self):
        self.register_state("mean_value", torch.zeros((), dtype=_ACC))
        self.register_state("weight", torch.zeros((), dtype=_ACC))

    def update(self, value, weight=1.0, dtype=None):
        value = as_tensor(self, "value", value)
        if isinstance(weight, (int, float)) and not isinstance(weight, bool):
            self.mean_value.add_(value.to(_ACC).sum() * weight)
            self.weight.add_(float(weight) * value.numel())
            self._dtype = dtype
            return
        weight = as_tensor(self, "weight", weight)
        try:
            weight = torch.broadcast_to(weight, value.shape)
        except RuntimeError:
            raise ValueError(
                f"MeanMetric {self.name!r}: weight has shape {tuple(weight.shape)}, which does "
                f"not broadcast to value's shape {tuple(value.shape)}; pass a number, or a "
                "tensor that broadcasts to the value.") from None
        self.mean_value.add_((value.to(_ACC) * weight.to(_ACC)).sum())
        self.weight.add_(weight.to(_ACC).sum())
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        value = self._value(self.mean_value) / self._value(self.weight)
        return self._warn_nan(self._result(value),
                              "no values (or only values of weight 0) were seen")


class PerplexityMetric(Metric):
    """``exp(total loss / total tokens)`` over all updates.

    ``update(labels, loss, weights=None, dtype=None)``: ``loss`` is the batch's loss *summed*
    over its tokens (a scalar), as in Cerebras' model zoo (for a mean-reduced cross entropy
    pass ``loss * num_tokens``); the batch's tokens are ``labels.numel()``, or the number of
    ``weights`` greater than 0 when given. ``compute()`` returns a 0-d float32 tensor (or of
    the ``dtype`` given); nan before any token.

    >>> import math, torch, cstream
    >>> ppl = cstream.metrics.PerplexityMetric("perplexity")
    >>> ppl(labels=torch.zeros(2, 3, dtype=torch.long), loss=torch.tensor(6 * math.log(4.0)))
    >>> round(float(ppl), 5)
    4.0
    """

    def reset(self):
        self.register_state("total_loss", torch.zeros((), dtype=_ACC))
        self.register_state("total_num_tokens", torch.zeros((), dtype=_ACC))

    def update(self, labels, loss, weights=None, dtype=None):
        labels = as_tensor(self, "labels", labels)
        loss = as_tensor(self, "loss", loss)
        if loss.numel() != 1:
            raise ValueError(
                f"PerplexityMetric {self.name!r}: loss has shape {tuple(loss.shape)}; it must be "
                "the batch's loss summed over its tokens (one number). Pass loss.sum() for "
                "per-token losses."
            )
        tokens = labels.numel()  # a Python number: see AccuracyMetric.update
        if weights is not None:
            tokens = (as_tensor(self, "weights", weights) > 0).to(_ACC).sum()
        self.total_loss.add_(loss.reshape(()).to(_ACC))
        self.total_num_tokens.add_(tokens)
        self._dtype = dtype

    def compute(self) -> torch.Tensor:
        value = torch.exp(self._value(self.total_loss) / self._value(self.total_num_tokens))
        return self._warn_nan(self._result(value), "no tokens were seen")
