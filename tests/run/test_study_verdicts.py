"""The verdict rule of a study on hand-made numbers (docs/studies.md), Newcombe's interval against
his published examples, and the early-warning lead times on hand-made curves."""

from __future__ import annotations

import pandas as pd
import pytest

from rllib_ragen.intervals import newcombe_difference_interval
from rllib_ragen.run.early_warning import (
    ENTROPY,
    GRAD_NORM,
    IN_GROUP_STD,
    TRAINING_SUCCESS,
    WarningTimes,
    early_warning_verdict,
    warning_times,
)
from rllib_ragen.run.study import Compare
from rllib_ragen.run.study_verdicts import ArmOutcome, verdict

QUESTION = Compare("b", "a")


@pytest.mark.parametrize(
    "a,b,expected",
    [
        # Newcombe (1998), Statistics in Medicine 17:873, table II, method 10.
        ((56, 70), (48, 80), (0.0524, 0.3339)),
        ((9, 10), (3, 10), (0.1705, 0.8090)),
    ],
)
def test_newcombe_interval_matches_the_published_examples(a, b, expected):
    difference, low, high = newcombe_difference_interval(*a, *b)
    assert difference == pytest.approx(a[0] / a[1] - b[0] / b[1])
    assert (low, high) == pytest.approx(expected, abs=1e-4)


def _verdict(a: dict[int, int], b: dict[int, int], n: int = 128) -> str:
    return verdict(QUESTION, ArmOutcome("b", b, n), ArmOutcome("a", a, n))


def test_yes_needs_the_interval_above_zero_and_every_seed_agreeing():
    line = _verdict({0: 64, 1: 60}, {0: 90, 1: 86})
    assert line.startswith("YES: b 0.688 [")
    assert "difference +0.203 [" in line and "by training seed (0, 1) +0.203, +0.203" in line


def test_below_is_the_mirror_image():
    assert _verdict({0: 90, 1: 86}, {0: 64, 1: 60}).startswith("NO, BELOW:")


def test_a_pooled_gain_that_one_seed_reverses_is_seed_dependent():
    # Pooled: 0.703 against 0.500, an interval well above 0; but seed 1 of b ends below seed 1 of a.
    line = _verdict({0: 40, 1: 88}, {0: 112, 1: 68})
    assert line.startswith("SEED-DEPENDENT:") and "+0.562, -0.156" in line


def test_an_interval_across_zero_shows_no_difference_even_when_the_seeds_agree():
    line = _verdict({0: 64, 1: 64}, {0: 70, 1: 68})
    assert line.startswith("NO DIFFERENCE SHOWN:") and "+0.047, +0.031" in line


def test_an_arm_with_one_finished_seed_is_not_answered():
    assert _verdict({0: 64}, {0: 120, 1: 120}).startswith("NOT ANSWERED: a has 1 finished training seed(s)")


def test_counts_outside_the_evaluation_are_refused():
    with pytest.raises(ValueError, match="arm a seed 0: 130 successes of 128 seeds"):
        ArmOutcome("a", {0: 130}, 128)


def _history(success, spread, entropy, grad) -> pd.DataFrame:
    frame = pd.DataFrame(
        {TRAINING_SUCCESS: success, IN_GROUP_STD: spread, ENTROPY: entropy, GRAD_NORM: grad},
        index=range(1, len(success) + 1),
    )
    frame.index.name = "iteration"
    return frame


def test_lead_times_of_a_collapse_that_the_spread_and_a_grad_spike_announce():
    # Success climbs to 0.6 and falls from iteration 11: its 3-iteration mean halves at 13, for good. The
    # spread's mean halves at 7, the entropy's at 10, and the gradient norm jumps at 11.
    success = [0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.4, 0.1, 0.0, 0.0, 0.0, 0.0]
    spread = [1.0, 1.0, 1.0, 1.0, 0.9, 0.3, 0.2, 0.2, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]
    entropy = [0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.7, 0.6, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    grad = [1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 1.1, 1.0, 1.0, 1.2, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    times = warning_times("run", _history(success, spread, entropy, grad))
    assert times == WarningTimes("run", collapse=13, spread_fall=7, entropy_fall=10, grad_spike=11)
    assert (times.lead(times.spread_fall), times.lead(times.entropy_fall), times.lead(times.grad_spike)) == (6, 3, 2)


def test_a_dip_that_recovers_is_no_collapse():
    success = [0.6, 0.6, 0.6, 0.1, 0.1, 0.1, 0.6, 0.7, 0.7]
    assert warning_times("run", _history(success, [1.0] * 9, [1.0] * 9, [1.0] * 9)).collapse is None


def test_the_early_warning_verdict_counts_leads_and_false_alarms():
    ahead = WarningTimes("a", collapse=12, spread_fall=7, entropy_fall=10, grad_spike=11)
    late = WarningTimes("b", collapse=8, spread_fall=9, entropy_fall=None, grad_spike=None)
    steady = WarningTimes("c", collapse=None, spread_fall=4, entropy_fall=None, grad_spike=None)
    line = early_warning_verdict([ahead, steady])
    assert line.startswith("REPRODUCED: 1 of 2 runs collapsed; spread or entropy fell first in 1/1")
    assert "spread fall first in 1/1 (median 5 iterations early)" in line and line.endswith("false alarms: 1/1 steady runs")
    assert early_warning_verdict([ahead, late]).startswith("NOT REPRODUCED: 2 of 2 runs collapsed; spread or entropy fell first in 1/2")
    assert early_warning_verdict([steady]).startswith("NOT TESTABLE: none of the 1 runs collapsed")
