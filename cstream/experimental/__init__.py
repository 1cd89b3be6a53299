"""``cstream.experimental``: the same names as the top level (Cerebras' porting guide imports
this path).

>>> import cstream.experimental as cstorch
>>> import cstream.experimental.metrics as metrics
>>> metrics is cstorch.metrics
True
"""

import sys as _sys

import cstream as _cstream
from cstream import __all__ as _all
from cstream import amp, distributed, metrics, optim, utils  # noqa: F401

_all = [n for n in _all if n != "experimental"]  # this module itself is the last name set
globals().update({n: getattr(_cstream, n) for n in _all})

for _name in ("amp", "distributed", "metrics", "optim", "utils"):
    _sys.modules[f"{__name__}.{_name}"] = getattr(_cstream, _name)

from cstream.experimental import listener  # noqa: E402
from cstream.unsupported import unsupported as _unsupported  # noqa: E402

run_implicit_autoregressive_loop = _unsupported(
    "the on-device autoregressive generation loop "
    "(cerebras.pytorch.experimental.run_implicit_autoregressive_loop)")

__all__ = list(_all) + ["listener", "run_implicit_autoregressive_loop"]
