"""The newcomer check: ``newcomer.py`` under the real ``cerebras.pytorch`` (CPU backend).

Writes into ``fixtures/``: ``newcomer_real.txt`` (what the 20-step run printed: losses, learning
rates, accuracy, 6 significant digits), ``newcomer_real_step_10.h5`` (its step-10 checkpoint, for
cstream to resume from) and ``newcomer_real_from_cstream.txt`` (what the real package printed
resuming from ``cstream_written/newcomer_cstream_step_10.h5``, the checkpoint cstream's run of the
same script wrote). ``tests/test_newcomer.py`` runs the script under cstream and compares.
Each run is its own process (one backend per process). Never imports cstream.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def run(*args: str) -> str:
    """The lines ``newcomer.py`` printed (its result lines only, not the package's logging)."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, str(HERE / "newcomer.py"), "--backend", "CPU",
                               "--out", out, *args], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"newcomer.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        if not args:
            shutil.copy(pathlib.Path(out) / "step_10.h5", HERE / "fixtures" / "newcomer_real_step_10.h5")
    return "".join(line + "\n" for line in done.stdout.splitlines()
                   if line.startswith(("step ", "accuracy ")))


def main(out: pathlib.Path) -> None:
    (out / "newcomer_real.txt").write_text(run())
    print(f"  wrote {out / 'newcomer_real.txt'} and newcomer_real_step_10.h5")
    cstream_ckpt = HERE / "cstream_written" / "newcomer_cstream_step_10.h5"
    (out / "newcomer_real_from_cstream.txt").write_text(run("--resume", str(cstream_ckpt)))
    print(f"  wrote {out / 'newcomer_real_from_cstream.txt'}")
