"""The newcomer check: ``tests/reference/newcomer.py`` (Adam, a LinearLR warm-up, an accuracy
metric, a checkpoint at step 10) prints under cstream's CSX backend what it printed under the real
``cerebras.pytorch`` CPU backend (``fixtures/newcomer_real.txt``, by ``gen_newcomer.py``), and each
resumes from the other's step-10 checkpoint to the other's steps 11-20. The printed numbers are
compared as numbers, within float32's bound across CPUs (``reference/tolerance.py``).

A failing comparison names the first line that differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from reference.tolerance import assert_lines_close

# compares with numbers another program made on another CPU (make test reruns these under
# other float kernels: ATEN_CPU_CAPABILITY / MKL_CBWR)
pytestmark = pytest.mark.cross_cpu

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "reference"
FIXTURES = REFERENCE / "fixtures"


def newcomer(tmp_path: Path, *args: str) -> list[str]:
    """The result lines ``newcomer.py`` prints when run under cstream on the CSX backend."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done = subprocess.run([sys.executable, str(REFERENCE / "newcomer.py"), "--backend", "CSX",
                           "--out", str(tmp_path), *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, f"newcomer.py {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return [line for line in done.stdout.splitlines() if line.startswith(("step ", "accuracy "))]


def steps_behind(line: str) -> int:
    """How many training steps produced a printed line: ``step k ...`` k, ``accuracy`` all 20."""
    words = line.split()
    return int(words[1]) if words[0] == "step" else 20


def compare(got: list[str], want: list[str], what: str) -> None:
    """The lines say the same: equal words, numbers within float32's bound for the steps behind
    them plus one printed digit (the real package printed on another CPU and torch version)."""
    for i, (a, b) in enumerate(zip(got, want)):
        assert_lines_close(a, b, steps_behind(b), f"{what}: line {i + 1}")
    assert len(got) == len(want), f"{what}: cstream printed {len(got)} lines, the real package {len(want)}"


@pytest.fixture(scope="module")
def cstream_run(tmp_path_factory) -> tuple[list[str], Path]:
    out = tmp_path_factory.mktemp("newcomer")
    return newcomer(out), out / "step_10.h5"


def real(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_the_script_runs_under_cstream_and_writes_its_step_10_checkpoint(cstream_run):
    lines, ckpt = cstream_run
    assert [line.split()[:2] for line in lines[:-1]] == [["step", str(i)] for i in range(1, 21)]
    assert lines[-1].startswith("accuracy ") and ckpt.exists()
    assert [line.split()[:2] for line in real("newcomer_real.txt")] == \
        [line.split()[:2] for line in lines]


def test_cstream_prints_what_the_real_package_printed(cstream_run):
    compare(cstream_run[0], real("newcomer_real.txt"), "the 20-step run")


def test_cstream_resumes_the_real_packages_step_10_checkpoint_to_its_steps_11_to_20(tmp_path):
    got = newcomer(tmp_path, "--resume", str(FIXTURES / "newcomer_real_step_10.h5"))
    compare(got[:-1], real("newcomer_real.txt")[10:20], "steps 11-20 resumed from the real file")


def test_the_real_package_resumed_cstreams_checkpoint_to_cstreams_steps_11_to_20(cstream_run):
    compare(real("newcomer_real_from_cstream.txt")[:-1], cstream_run[0][10:20],
            "steps 11-20 the real package ran from cstream's file")
