"""Every ```python block of README.md and docs/*.md runs as pasted, each in a fresh interpreter
(a new user's session), from an empty folder with the repository importable.

A block that goes on from the one before it says so on the line above its fence,
``<!-- continues the example above -->``: it runs after the blocks it continues, in the same
interpreter and folder, as a reader pasting them in order would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
CONTINUES = "<!-- continues the example above -->"


def python_blocks() -> list:
    out = []
    for path in DOCS:
        text = path.read_text()
        chain: list[str] = []
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 1
            before = text[:m.start()].rstrip().splitlines()
            if before and before[-1].strip() == CONTINUES and chain:
                chain.append(m.group(1))
            else:
                chain = [m.group(1)]
            out.append(pytest.param("\n".join(chain), id=f"{path.relative_to(REPO)}:{line}"))
    return out


BLOCKS = python_blocks()


def test_the_documentation_has_python_blocks_to_run():
    ids = [p.id for p in BLOCKS]
    assert any(i.startswith("README.md:") for i in ids)
    assert any(i.startswith("docs/profiling.md:") for i in ids)


@pytest.mark.timeout(450)  # a block may start Ray and run a few hundred steps
@pytest.mark.parametrize("code", BLOCKS)
def test_documentation_block_runs_as_pasted(code, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=420)
    assert out.returncode == 0, f"stdout:\n{out.stdout[-2000:]}\nstderr:\n{out.stderr[-4000:]}"
    assert "Traceback" not in out.stderr
