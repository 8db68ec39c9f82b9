"""The Wilson score interval against values computed by hand (z = 1.959964)."""

from __future__ import annotations

import pytest

from agentenv.bench.stats import wilson_interval


def test_wilson_interval_by_hand():
    iv = wilson_interval(50, 100)
    assert (iv.mean, iv.low, iv.high) == pytest.approx((0.5, 0.403832, 0.596168), abs=1e-6)
    zero = wilson_interval(0, 300)  # the Wald interval would be [0, 0]
    assert zero.low == 0.0 and zero.high == pytest.approx(0.012643, abs=1e-6)
    assert wilson_interval(300, 300).low == pytest.approx(0.987357, abs=1e-6)
