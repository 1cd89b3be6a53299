"""Shared fixtures: one embedded Ray per test session; a clean backend for every test."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402

from executor import runtime  # noqa: E402


LONG_RUNS = os.path.join(os.path.dirname(__file__), "long_runs.txt")


def _long_runs() -> set[str]:
    with open(LONG_RUNS) as f:
        return {line.strip() for line in f if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    """Mark the tests listed in long_runs.txt ``slow``; a listed id that names no test of a
    whole-suite collection is an error (a renamed test must be listed anew)."""
    long_runs = _long_runs()
    seen = set()
    for item in items:
        if item.nodeid in long_runs:
            item.add_marker(pytest.mark.slow)
            seen.add(item.nodeid)
    whole_suite = not config.args or config.args == [str(config.rootpath / "tests")] or \
        config.args == ["tests"]
    missing = sorted(long_runs - seen)
    if whole_suite and missing:
        raise pytest.UsageError(
            f"tests/long_runs.txt names {len(missing)} test(s) the suite does not have: "
            + ", ".join(missing[:5]) + ". Rename them there too, or remove the lines.")


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
