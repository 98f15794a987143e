"""95% intervals against values computed by hand (and a textbook table)."""

from __future__ import annotations

import math

import pytest

from rllib_ragen.intervals import Z95, format_rate, paired_difference_interval, wilson_interval


def test_wilson_interval_by_hand():
    # 0 of 10: [0, z^2 / (n + z^2)] = [0, 3.8415 / 13.8415].
    assert wilson_interval(0, 10) == pytest.approx((0.0, Z95**2 / (10 + Z95**2)))
    # 8 of 10 (Newcombe 1998, Table I: 0.4902 to 0.9433).
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson_interval(64, 128)[0] < 0.5 < wilson_interval(64, 128)[1]


def test_paired_difference_by_hand():
    """10 seeds: 4 gained, 1 lost, 5 unchanged -> +0.3; Agresti-Min adds half a count per cell."""
    before = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    after = [1, 1, 1, 1, 0, 1, 1, 0, 0, 0]
    difference, low, high = paired_difference_interval(before, after)
    g, l, m = 4.5, 1.5, 12
    half = Z95 * math.sqrt((g + l) - (g - l) ** 2 / m) / m
    assert difference == pytest.approx(0.3)
    assert (low, high) == pytest.approx(((g - l) / m - half, (g - l) / m + half))


def test_identical_evaluations_have_an_interval_around_zero():
    outcomes = [1, 0] * 64
    difference, low, high = paired_difference_interval(outcomes, outcomes)
    assert difference == 0.0 and low < 0 < high


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="n must be >= 1"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="equally long"):
        paired_difference_interval([1], [1, 0])


def test_format_rate():
    assert format_rate([1, 0, 0, 0]).startswith("0.250 [")

