"""``cstream.nn``: the Cerebras modules that Model Zoo models use.

:class:`Scope` marks a block's boundaries for the compiler (an identity here), :class:`StripPadding`
drops padded positions, :class:`DiceCELoss` is the Dice + cross-entropy loss of the UNet models.
"""

from cstream.nn import functional
from cstream.nn.modules import DiceCELoss, Scope, StripPadding

__all__ = ["DiceCELoss", "Scope", "StripPadding", "functional"]
