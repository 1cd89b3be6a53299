"""``cstream.experimental``: the same names as the top level (seed 000 imports this path).

>>> import cstream.experimental as cstorch
>>> import cstream.experimental.metrics as metrics
>>> metrics is cstorch.metrics
True
"""

import sys as _sys

import cstream as _cstream
from cstream import *  # noqa: F401,F403
from cstream import __all__ as _all
from cstream import amp, distributed, metrics, optim, utils  # noqa: F401

for _name in ("amp", "distributed", "metrics", "optim", "utils"):
    _sys.modules[f"{__name__}.{_name}"] = getattr(_cstream, _name)

__all__ = list(_all)
