"""Every docstring example (``>>>``) in the packages runs and gives what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cstream", "cstream_tools", "executor", "workers")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        for info in pkgutil.walk_packages([str(REPO / package)], prefix=f"{package}."):
            names.append(info.name)
    return sorted(names)


def _with_examples(name: str) -> bool:
    path = REPO / (name.replace(".", "/") + ".py")
    if not path.is_file():
        path = REPO / name.replace(".", "/") / "__init__.py"
    return path.is_file() and ">>>" in path.read_text()


MODULES = [m for m in _modules() if _with_examples(m)]


def test_the_doctests_are_found():
    assert {"cstream_tools.experiment", "executor.report", "executor.timeline", "executor.phases",
            "cstream_tools.cli_errors", "cstream.summaries", "workers.errors"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False)
    assert result.attempted > 0, f"{name} has '>>>' but no example doctest found"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
