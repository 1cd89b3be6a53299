"""``cstream.experimental``: the same names as the top level (Cerebras' porting guide imports
this path). ``cstream/__init__.py`` copies them in once it has bound them all, so this module
imports nothing of the top level's.

>>> import cstream.experimental as cstorch
>>> import cstream.experimental.metrics as metrics
>>> metrics is cstorch.metrics
True
"""

from cstream.experimental import listener
from cstream.unsupported import unsupported as _unsupported

run_implicit_autoregressive_loop = _unsupported(
    "the on-device autoregressive generation loop "
    "(cerebras.pytorch.experimental.run_implicit_autoregressive_loop)")

__all__ = ["listener", "run_implicit_autoregressive_loop"]  # the top level's names are added
