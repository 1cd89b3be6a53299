"""The Cerebras modules Model Zoo models build."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Scope(torch.nn.Module):
    """Marks where the block ``scope_name`` begins (``forward``) and ends (``exit``) for the
    Cerebras compiler's placement. cstream's graph has no such boundaries: both return their
    input unchanged.

    >>> s = Scope("attention"); x = torch.ones(2)
    >>> s(x) is x, s.exit(x) is x
    (True, True)
    """

    def __init__(self, scope_name: str):
        super().__init__()
        self.scope_name = scope_name

    def forward(self, input):
        return input

    def exit(self, input):
        return input


class StripPadding(torch.nn.Module):
    """Variable tensor shape: on a CS-X, positions where ``mask`` is 0 are not computed. cstream
    computes every position; it sets the padded positions of ``input`` to 0, which is what the
    strip leaves there, and keeps the shape.

    >>> StripPadding()(torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 0]])).tolist()
    [[5, 6, 0]]
    """

    def forward(self, input: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if mask.shape != input.shape[: mask.dim()]:
            raise ValueError(
                f"StripPadding: the mask's shape {tuple(mask.shape)} must be the leading "
                f"dimensions of the input's {tuple(input.shape)}."
            )
        keep = mask.to(torch.bool).reshape(tuple(mask.shape) + (1,) * (input.dim() - mask.dim()))
        return torch.where(keep, input, torch.zeros((), dtype=input.dtype))


def _to_one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[N, ...]`` class ids as ``[N, C, ...]`` one-hot floats."""
    onehot = F.one_hot(labels.long(), num_classes).float()
    return onehot.permute(0, onehot.dim() - 1, *range(1, onehot.dim() - 1))


class DiceCELoss(torch.nn.Module):
    """``wc * cross_entropy + wd * (1 - mean Dice)`` of a segmentation (logits ``[N, C, ...]``,
    labels ``[N, ...]``); without the background channel the mean Dice is corrected by
    ``C / (C - 1)``, as the Cerebras loss.

    >>> loss = DiceCELoss(num_classes=2, include_background=True)
    >>> logits = torch.tensor([[[[9.0]], [[-9.0]]]]); labels = torch.tensor([[[0]]])
    >>> round(float(loss(logits, labels, [1, 2, 1, 1])), 4)  # class 1 absent: its Dice is 0
    0.25
    """

    def __init__(self, num_classes: int, include_background: bool, wc: float = 0.5,
                 wd: float = 0.5):
        super().__init__()
        self.num_classes = num_classes
        self.include_background = include_background
        self.wc, self.wd = wc, wd
        self.mean_correction = 1.0 if include_background else num_classes / (num_classes - 1)
        self.cross_entropy = torch.nn.CrossEntropyLoss()

    def _dice(self, outputs, labels, input_shape):
        prediction = torch.softmax(outputs, dim=1)
        target = _to_one_hot(labels, self.num_classes)
        if not self.include_background:
            weights = torch.ones(list(input_shape), dtype=prediction.dtype,
                                 device=prediction.device)
            weights[:, 0] = 0
            target, prediction = target * weights, prediction * weights
        axes = list(range(2, prediction.dim()))
        intersection = torch.sum(target * prediction, dim=axes)
        total = torch.sum(target, dim=axes) + torch.sum(prediction, dim=axes)
        return 2.0 * intersection / (total + 1e-6)

    def forward(self, outputs, labels, input_shape):
        ce = self.cross_entropy(outputs, labels.long())
        dice = self.mean_correction * torch.mean(self._dice(outputs, labels, input_shape))
        return self.wc * ce + self.wd * (1.0 - dice)


class SmoothL1Loss(torch.nn.Module):
    """The Cerebras Smooth L1 loss: ``0.5 z^2 / beta`` where ``z = |input - target| < beta``,
    else ``z - 0.5 beta``; reduced by ``"mean"``, ``"sum"`` or not at all (any other value)."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__()
        if beta < 0:
            raise ValueError(f"SmoothL1Loss only supports non-negative values for beta, got {beta}.")
        self.reduction = reduction
        self.beta = beta

    def forward(self, input, target):
        z = torch.abs(input - target)
        loss = torch.where(z < self.beta, 0.5 * z * z / self.beta, z - 0.5 * self.beta)
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss
