"""Shared fixtures: one embedded Ray per test session; a clean backend for every test."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402

from executor import runtime  # noqa: E402


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path, monkeypatch):
    """Default artifact directories (cwd/cstream_logs) land in the test's own folder."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _clean_backend():
    """Every test starts and ends without a current backend or executor, and with mixed
    precision off (its switch is process-wide, as in cerebras.pytorch)."""
    from cstream import amp

    runtime.reset()
    yield
    runtime.reset()
    amp.set_half_dtype("float16")
    amp.enable_mixed_precision(False)


@pytest.fixture(scope="session")
def ray_session():
    """Start Ray once for the whole session (embedded, loopback, no dashboard)."""
    import ray

    from executor.ray_session import ensure_ray

    started = ensure_ray()
    yield ray
    if started and ray.is_initialized():
        ray.shutdown()
