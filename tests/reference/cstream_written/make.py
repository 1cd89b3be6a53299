"""Writes with cstream ``cstream_state.h5`` (tensors LZ4-compressed, the default) and
``cstream_state_uncompressed.h5`` (``compress=False``): the files the real package is asked to read;
and, unless ``--no-newcomer`` is given, ``newcomer_cstream_step_10.h5``, the step-10 checkpoint of
``../newcomer.py`` run under cstream (CSX).

Run it under cstream (``python tests/reference/cstream_written/make.py``) when the object below or
cstream's writer changes, then ``make reference`` (or ``cd tests && /work/cbref/bin/python -m
reference.generate gen_ckpt``) so the real package reads them again and records what it read
in ``fixtures/ckpt_cstream_read_by_real.json``. ``tests/test_checkpoint_reference.py`` checks that
record against :func:`state`. :func:`state` uses only torch, so the test can rebuild it.
"""

from __future__ import annotations

import collections
import math
import pathlib

import torch

HERE = pathlib.Path(__file__).resolve().parent
FILE = HERE / "cstream_state.h5"  # tensors LZ4-compressed, as cstream.save writes by default
UNCOMPRESSED = HERE / "cstream_state_uncompressed.h5"  # cstream.save(..., compress=False)


def state() -> dict:
    """Every kind of value a checkpoint holds, with values that do not depend on a random seed."""
    w = (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5.5) / 7
    model = collections.OrderedDict([
        ("fc.weight", w), ("fc.bias", torch.tensor([0.25, -0.5, 1e-3])),
        ("bn.running_mean", torch.zeros(3)), ("bn.num_batches_tracked", torch.tensor(7)),
        ("head.weight", w),  # tied to fc.weight: saved once, as a link
    ])
    return {
        "model": model,
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": w.to(torch.bfloat16),
                                    "exp_avg_sq": (w * w).to(torch.float16)}, 1: {}},
                      "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8,
                                        "amsgrad": False, "foreach": None, "params": [0, 1]}]},
        "tensors": {"bf16": torch.tensor([1.0, -0.0, math.inf, 3.140625], dtype=torch.bfloat16),
                    "fp16": torch.tensor([65504.0, -2.0 ** -24, math.nan], dtype=torch.float16),
                    "int32": torch.tensor([[-(2 ** 31), 0], [1, 2 ** 31 - 1]], dtype=torch.int32),
                    "uint8": torch.arange(250, 256, dtype=torch.uint8),
                    "bool": torch.tensor([True, False]), "scalar": torch.tensor(2.5, dtype=torch.float64),
                    "empty": torch.zeros(0, 2)},
        "plain": {"step": 12, "big": 2 ** 70, "ratio": -0.0, "inf": math.inf, "text": "héllo wörld",
                  "none": None, "flag": True, "nested": [1, (2.5, "x"), [], {}, ()]},
        "pickled": {"bytes": b"\x00\xff", "dtype": torch.bfloat16, "complex": 1 - 2j},
        "odd keys": {"a/b": torch.ones(1), "100%": torch.full((2,), 4.0)},
    }


def main() -> None:
    import shutil
    import subprocess
    import sys
    import tempfile

    import cstream

    cstream.save(state(), FILE)
    cstream.save(state(), UNCOMPRESSED, compress=False)
    print(f"wrote {FILE} and {UNCOMPRESSED}")
    if "--no-newcomer" in sys.argv:
        return
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, str(HERE.parent / "newcomer.py"), "--backend", "CSX",
                        "--out", out], check=True, timeout=600)
        shutil.copy(f"{out}/step_10.h5", HERE / "newcomer_cstream_step_10.h5")
    print(f"wrote {HERE / 'newcomer_cstream_step_10.h5'}")


if __name__ == "__main__":
    main()
