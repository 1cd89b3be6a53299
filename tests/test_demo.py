"""The demo (examples/train.py, what `make demo` runs) writes TensorBoard events a user can open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_demo_writes_the_loss_and_the_rates_every_step_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train.py"), "--artifact-dir", "art",
         "--steps", "12", "--checkpoint-steps", "6", "--in-process", "--log-every", "4"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "TensorBoard: tensorboard --logdir art/tensorboard" in out.stdout
    acc = EventAccumulator(str(tmp_path / "art" / "tensorboard"))
    acc.Reload()
    for tag in ("loss", "rate", "global_rate", "wafer/compute_s", "workers/csx0_w1/batches_per_s"):
        assert [e.step for e in acc.Scalars(tag)] == list(range(1, 13)), tag
    printed = [ln for ln in out.stdout.splitlines() if ln.startswith("step    4")][0]
    assert float(printed.split()[3]) == round(acc.Scalars("loss")[3].value, 4)
