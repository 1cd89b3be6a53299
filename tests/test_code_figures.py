"""The input side's size and reach limits, read by tools/code_figures.py: no class over 350
lines, no file over 800, and no private name of torch, Ray or another package reached outside
the compat modules (workers/torch_compat.py, workers/ray_compat.py)."""

import pytest

from tools import code_figures

PACKAGES = ("cstream", "cstream_tools", "executor", "workers")


@pytest.mark.parametrize("package", PACKAGES)
def test_package_within_limits(package):
    files, classes, reached = code_figures.figures(package)
    assert files[0][0] <= 800, f"{files[0][1]} has {files[0][0]} lines (limit 800)"
    assert classes[0][0] <= 350, f"{classes[0][1]} has {classes[0][0]} lines (limit 350)"
    assert reached == [], "private names reached outside the compat modules:\n" + \
        "\n".join(reached)


def test_figures_find_private_reaches(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        "import torch._dynamo\n"
        "from ray._private import worker\n"
        "import sys\n"
        "from pkg._own import helper\n"
        "class Box:\n"
        "    _mine = 1\n"
        "    def get(self, other):\n"
        "        return self._hidden, other._mine, other._theirs, sys._getframe, x._fields\n")
    files, classes, reached = code_figures.figures("pkg", root=tmp_path)
    assert files == [(8, "pkg/mod.py")]
    assert classes == [(4, "pkg/mod.py:5 Box")]
    assert [r.split(" ", 1)[1] for r in reached] == [
        "import torch._dynamo", "from ray._private import worker", "other._theirs",
        "sys._getframe"]
