"""The examples' digits ship with the repository: scikit-learn is a test dependency only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_digits_equal_scikit_learns_load_digits():
    from sklearn.datasets import load_digits as sklearn_digits

    from examples.data import load_digits

    x, y = load_digits()
    want_x, want_y = sklearn_digits(return_X_y=True)
    assert np.array_equal(x.numpy(), want_x) and np.array_equal(y.numpy(), want_y)


def test_the_examples_input_functions_run_without_scikit_learn_installed(tmp_path):
    # a stub package that refuses to import stands in for an environment without scikit-learn
    (tmp_path / "sklearn").mkdir()
    (tmp_path / "sklearn" / "__init__.py").write_text("raise ImportError('no scikit-learn')\n")
    code = ("import data, cstream\n"
            "import importlib.util\n"
            "assert importlib.util.find_spec('sklearn') is not None\n"
            "_ = cstream.backend('CPU')\n"
            "x, y = next(iter(data.train_input_fn(batch_size=8)))\n"
            "print(tuple(x.shape), tuple(y.shape), len(data.digits('test')))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "examples"),
                                                        str(REPO)]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "(8, 64) (8,) 297"
