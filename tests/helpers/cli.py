"""The ``cstream`` command in a subprocess, and the summary tables it and the run report print."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child_env(**extra) -> dict:
    """This process's environment for a child Python that imports the checkout's packages and
    the tests' own modules (``helpers``, ``reference``, the test files), with ``extra`` set."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), **extra)


def cstream(*args, cwd, timeout=240):
    """``cstream ARGS`` as a new process in ``cwd`` (100 columns wide)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "cstream_tools.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def table_rows(text):
    """{label: value} of the lines of a summary table (label and value are separated by two
    spaces or more; a line without two parts, such as a title or a rule, is left out)."""
    rows = {}
    for line in text.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            rows[parts[0]] = parts[1]
    return rows


def multinode_runs(out_dir, runs: str | None = None, timeout: int = 900) -> dict:
    """Run ``tests/multinode_cluster.py`` (its ``--runs``, default its own) in a process of its
    own, in ``out_dir``; the results it wrote, or the test fails with the child's output."""
    import json

    import pytest

    script = REPO / "tests" / "multinode_cluster.py"
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = out_dir / "runs.json"
    cmd = [sys.executable, str(script), str(out), *(["--runs", runs] if runs else [])]
    try:
        done = subprocess.run(cmd, cwd=out_dir, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the 3-node runs did not end within {timeout} s; their output ended "
                    f"with:\n{(e.stderr or b'')[-4000:]!r}")
    if done.returncode != 0:
        pytest.fail(f"the 3-node runs failed (exit {done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(out.read_text())
