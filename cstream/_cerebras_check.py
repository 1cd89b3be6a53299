"""cstream never shadows a real Cerebras package silently.

cstream ships ``cerebras.pytorch`` / ``cerebras_pytorch`` (and the appliance's names) as aliases
of itself. When a Cerebras package with the same name is installed too, Python imports whichever
comes first on ``sys.path``; this module says which one a process uses, with a
:class:`CerebrasPackageWarning`: when cstream's alias is imported and a real package is also on
the path, and when ``import cstream`` finds that ``cerebras.pytorch`` is the real package.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

OURS = Path(__file__).resolve().parent.parent  # the folder holding cstream/ and the aliases
NAMES = {"cerebras.pytorch": ("cerebras", "pytorch"), "cerebras_pytorch": ("cerebras_pytorch",),
         "cerebras.appliance": ("cerebras", "appliance"),
         "cerebras_appliance": ("cerebras_appliance",)}
_warned: set[str] = set()


class CerebrasPackageWarning(UserWarning):
    """A real Cerebras package and cstream's alias of the same name are both installed."""


def others(name: str) -> list[str]:
    """Folders on ``sys.path`` (other than cstream's) that hold a package ``name``."""
    found = []
    for entry in sys.path:
        try:
            base = Path(entry or ".").resolve()
        except OSError:
            continue
        if base == OURS:
            continue
        pkg = base.joinpath(*NAMES[name])
        if (pkg / "__init__.py").is_file() and str(pkg) not in found:
            found.append(str(pkg))
    return found


def _warn(name: str, message: str) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(message, CerebrasPackageWarning, stacklevel=3)


def check_alias_in_use(name: str) -> None:
    """Called when cstream's alias ``name`` is imported: warn if a real one is installed too."""
    shadowed = others(name)
    if shadowed:
        _warn(name, f"{name} is cstream (from {OURS / Path(*NAMES[name])}); a Cerebras package "
                    f"of the same name is also installed at {shadowed[0]} and is NOT used in "
                    "this process. Remove cstream's folder from sys.path (or PYTHONPATH) to use "
                    "the Cerebras one.")


def check_real_in_use() -> None:
    """Called on ``import cstream``: warn if ``cerebras.pytorch`` would be a real package."""
    try:
        spec = importlib.util.find_spec("cerebras.pytorch")
    except (ImportError, ValueError):
        return
    if spec is None or spec.origin is None:
        return
    origin = Path(spec.origin).resolve()
    if OURS not in origin.parents:
        _warn("cerebras.pytorch",
              f"cerebras.pytorch is the Cerebras package at {origin.parent}, not cstream: "
              "programs that import cerebras.pytorch run on it. Put cstream's folder "
              f"({OURS}) first on sys.path (PYTHONPATH) to run them on cstream.")


check_real_in_use()
