"""``cstream.nn``: the Cerebras modules that Model Zoo models use.

:class:`Scope` marks a block's boundaries for the compiler (an identity here), :class:`StripPadding`
drops padded positions, :class:`DiceCELoss` is the Dice + cross-entropy loss of the UNet models,
:class:`SmoothL1Loss` the Cerebras Smooth L1 loss. :class:`SelectiveGrad` (masked weight
updates) is not simulated.
"""

from cstream.nn import functional
from cstream.nn.modules import DiceCELoss, Scope, SmoothL1Loss, StripPadding
from cstream.unsupported import unsupported_class

SelectiveGrad = unsupported_class(
    "SelectiveGrad", "selective gradient updates (cerebras.pytorch.nn.SelectiveGrad)")

__all__ = ["DiceCELoss", "Scope", "SelectiveGrad", "SmoothL1Loss", "StripPadding", "functional"]
