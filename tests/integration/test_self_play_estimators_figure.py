"""`benchmarks/self_play_estimators.py`: RAE against GRPO, read back from a store holding one run per arm."""

from __future__ import annotations

import pytest
from run_helpers import ROOT, load_script

from envs.user_errors import UserError
from rllib_ragen.run.analysis import ECHO_TRAP_SIGNALS, TRAINING_SECONDS
from rllib_ragen.run.tracking import MLflowTracker

RESPONSE_LENGTH = "env_runners/response_length_mean"


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _rates(opponent: str, win: tuple[float, float, float], loss: tuple[float, float, float]) -> dict[str, float]:
    key = f"evaluation/vs_{opponent}/"
    out = {}
    for outcome, (rate, low, high) in (("win", win), ("loss", loss)):
        out |= {f"{key}{outcome}_rate": rate, f"{key}{outcome}_rate_low": low, f"{key}{outcome}_rate_high": high}
    return out


def _log_arm(store, experiment, estimator, *, after_win, lengths, finished=True):
    """Game evaluation before RL (step 0) and after 2 iterations (6 minutes); training curves at 1 and 2."""
    tracker = MLflowTracker(tracking_uri=store, experiment=experiment)
    tracker.log_params({"advantage_estimator": estimator})
    tracker.log_metrics({TRAINING_SECONDS: 0.0, **_rates("random", (0.5, 0.4, 0.6), (0.4, 0.3, 0.5))}, step=0)
    for step, (seconds, length) in enumerate(zip((180.0, 360.0), lengths), start=1):
        curves = {TRAINING_SECONDS: seconds, ECHO_TRAP_SIGNALS["success rate"]: 0.25 * step, RESPONSE_LENGTH: length}
        tracker.log_metrics({**curves, ECHO_TRAP_SIGNALS["policy entropy"]: 0.1 / step}, step=step)
    tracker.log_metrics(_rates("random", (after_win, after_win - 0.1, after_win + 0.1), (0.2, 0.1, 0.3)), step=2)
    if finished:
        tracker.end()


def test_each_arm_gets_its_rates_before_and_after_and_its_curves_at_their_minutes(store, tmp_path, capsys):
    figure_script = load_script(ROOT / "benchmarks" / "self_play_estimators.py")
    _log_arm(store, "ttt-rae", "rae", after_win=0.7, lengths=(5.0, 6.0))
    _log_arm(store, "ttt-grpo", "grpo", after_win=0.55, lengths=(5.0, 2.0))
    _log_arm(store, "ttt-crashed", "reinforce", after_win=1.0, lengths=(1.0, 1.0), finished=False)
    output = figure_script.main(["--store", store, "--output", str(tmp_path / "arms.png")])
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "| rae | 2 | 6.0 | random | 0.500 [0.400, 0.600] -> 0.700 [0.600, 0.800] | " in table
    assert "| grpo | 2 | 6.0 | random | 0.500 [0.400, 0.600] -> 0.550 [0.450, 0.650] | " in table
    assert "| grpo | 2 | 6.0 | minimax | n/a | n/a |" in table  # not evaluated against minimax
    assert "| grpo | 0.250 -> 0.500 | 5.000 -> 2.000 | 0.100 -> 0.050 |" in table
    assert "reinforce" not in table  # an unfinished run is no arm

    arms = figure_script.arm_runs(store)
    success, length, _, wins = figure_script.plot_arms(arms).axes
    grpo = [line for line in length.get_lines() if line.get_label() == "grpo"][0]
    assert list(grpo.get_xdata()) == [3.0, 6.0] and list(grpo.get_ydata()) == [5.0, 2.0]
    # vs random: before and after for each of the two arms; nothing for the opponents no run evaluated.
    assert len(wins.containers) == 4


def test_a_store_with_fewer_than_two_arms_is_refused(store, tmp_path):
    figure_script = load_script(ROOT / "benchmarks" / "self_play_estimators.py")
    _log_arm(store, "ttt-rae", "rae", after_win=0.7, lengths=(5.0, 6.0))
    with pytest.raises(UserError, match="compares 2 or more"):
        figure_script.arm_runs(store)
    _log_arm(store, "ttt-rae-again", "rae", after_win=0.6, lengths=(5.0, 6.0))
    with pytest.raises(UserError, match="two experiments .* ran estimator 'rae'"):
        figure_script.arm_runs(store)
