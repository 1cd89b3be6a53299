"""File helpers."""

from __future__ import annotations

import time
from pathlib import Path


def create_symlink(src, dst, num_retries: int = 5, **kwargs) -> None:
    """Make ``src`` a symlink to ``dst``, replacing what is at ``src`` (retried: runs sharing a
    folder may race)."""
    src = Path(src)
    for _ in range(max(0, num_retries - 1)):
        try:
            src.unlink(missing_ok=True)
            src.symlink_to(dst, **kwargs)
            return
        except OSError:
            time.sleep(0.5)
    src.unlink(missing_ok=True)
    src.symlink_to(dst, **kwargs)
