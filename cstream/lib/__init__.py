"""``cerebras.pytorch.lib``: the Cerebras package's compiled library (see
:mod:`.cerebras_pytorch_lib`)."""

from cstream.lib import cerebras_pytorch_lib

__all__ = ["cerebras_pytorch_lib"]
