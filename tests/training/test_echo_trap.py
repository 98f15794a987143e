"""The echo-trap rule on hand-made signal curves, among them the collapse measured in issue 15's run."""

import math

import pytest

from rllib_ragen.training.echo_trap import EchoTrapMonitor, EchoTrapSettings

# In-group reward std per iteration of a 20-iteration default run as issue 15 measured it:
# 0.215 at the start, 0.025 by iteration 11, 0.000 from iteration 15 (no warning was given).
COLLAPSING_STD = [
    0.215,
    0.198,
    0.221,
    0.174,
    0.160,
    0.131,
    0.118,
    0.090,
    0.071,
    0.048,
    0.025,
    0.031,
    0.012,
    0.006,
    0.000,
    0.000,
    0.004,
    0.000,
    0.000,
    0.000,
]
# Noisy but healthy: the same early level, with single and paired dips to near 0 that recover.
HEALTHY_STD = [
    0.210,
    0.180,
    0.250,
    0.120,
    0.300,
    0.030,
    0.220,
    0.150,
    0.020,
    0.010,
    0.260,
    0.040,
    0.170,
    0.230,
    0.110,
    0.280,
    0.020,
    0.200,
    0.160,
    0.240,
]


def replay(values, signal="reward_variance", rule=None):
    monitor = EchoTrapMonitor(rule or EchoTrapSettings())
    return [
        (iteration, warnings)
        for iteration, warnings in enumerate((monitor.update({signal: v}) for v in values), start=1)
        if warnings
    ]


def test_the_issues_collapse_warns_by_iteration_13():
    # Early level: mean of iterations 1-3 = (0.215 + 0.198 + 0.221) / 3 = 0.2113; low below 0.2 x that = 0.0423.
    # Iterations 11 (0.025), 12 (0.031) and 13 (0.012) are the first 3 low ones in a row.
    flagged = replay(COLLAPSING_STD)
    assert [iteration for iteration, _ in flagged] == list(range(13, 21))
    (first,) = flagged[0][1].values()
    assert first.startswith("echo trap, reward-variance collapse: in-group reward std 0.012")
    assert "early level 0.2113" in first and "for 3 measurements" in first


def test_a_noisy_healthy_run_does_not_warn():
    # Same early level (0.2133, low below 0.0427); its lows (iterations 6, 9-10, 12, 17) never make 3 in a row.
    assert replay(HEALTHY_STD) == []


def test_a_recovery_resets_the_streak():
    rule = EchoTrapSettings(baseline_iters=2, patience=2, ratio=0.5)
    # Early level 1.0, low below 0.5: 0.1, then 0.9 recovers, then two lows in a row warn.
    assert [i for i, _ in replay([1.0, 1.0, 0.1, 0.9, 0.1, 0.1], rule=rule)] == [6]


def test_sparse_signals_name_their_collapse():
    # I(X;Z) and H(Z|X) measured at iterations 1, 5, 10, 15 (None in between): early level = iteration 1's.
    monitor = EchoTrapMonitor()
    mi = {1: 0.40, 5: 0.05, 10: 0.03, 15: 0.01}  # below 0.2 x 0.40 = 0.08 from iteration 5 on
    entropy = {1: 1.50, 5: 1.20, 10: 1.40, 15: 1.30}  # healthy
    warnings = {
        iteration: monitor.update(
            {
                "reward_variance": 0.2,
                "mutual_information": mi.get(iteration),
                "conditional_entropy": entropy.get(iteration),
            }
        )
        for iteration in range(1, 16)
    }
    assert [i for i, w in warnings.items() if w] == [15]
    assert list(warnings[15]) == ["mutual_information"]
    warning = warnings[15]["mutual_information"]
    assert warning.startswith("echo trap, template collapse: I(X;Z) 0.01") and "early level 0.4 " in warning
    collapsing_entropy = EchoTrapMonitor(EchoTrapSettings(patience=2))
    for value in (2.0, None, None, 0.3, 0.1):
        warning = collapsing_entropy.update({"conditional_entropy": value})
    assert warning["conditional_entropy"].startswith("echo trap, entropy collapse: H(Z|X) 0.1")


def test_signals_without_a_positive_early_level_never_warn():
    monitor = EchoTrapMonitor(EchoTrapSettings(baseline_iters=1, patience=1))
    assert monitor.update({"mutual_information": -0.01}) == {}
    assert monitor.update({"mutual_information": -5.0}) == {}  # 0.2 x a negative level: no collapse to measure
    assert monitor.update({"reward_variance": math.nan}) == {}
    assert monitor.baseline("reward_variance") is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"baseline_iters": 0}, "echo_trap_baseline_iters"),
        ({"patience": 0}, "echo_trap_patience"),
        ({"ratio": 1.5}, "echo_trap_ratio"),
        ({"ratio": 0.0}, "echo_trap_ratio"),
    ],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EchoTrapSettings(**kwargs)


def test_unknown_signals_are_named():
    with pytest.raises(ValueError, match="unknown echo-trap signals \\['entropy'\\]"):
        EchoTrapMonitor().update({"entropy": 1.0})
