"""Soak: memory stays flat and buffers bounded over a long run (short version in CI)."""

from __future__ import annotations

import pytest

from benchmarks.soak import soak
from workers.flow import DEFAULT_LOOKAHEAD_STEPS


def _check(r):
    assert r["client_rss_growth"] < 0.05, r["client_rss_growth"]
    assert r["driver_rss_growth"] < 0.05, r["driver_rss_growth"]
    assert r["max_outputs_kept"] <= DEFAULT_LOOKAHEAD_STEPS  # the look-ahead is a hard bound


def test_a_short_soak_keeps_memory_flat_and_buffers_bounded(ray_session):
    _check(soak(steps=2500, workers=8, sample_every=250, wafer_s=0.001))


@pytest.mark.slow
def test_a_20000_step_soak_keeps_memory_flat_and_buffers_bounded(ray_session):
    _check(soak(steps=20000, workers=8, sample_every=1000, wafer_s=0.001))
