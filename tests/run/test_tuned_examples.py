"""Each grid tuned example shows its whole config, and it is the config `rllib-ragen train --env ENV` runs:
the CPU preset, setting for setting; the same warm start; the same run settings (`TUNED_RUNS`)."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from run_helpers import ROOT, load_script

from rllib_ragen.algorithm.presets import cpu_preset
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.run.experiment import TUNED_RUNS
from rllib_ragen.run.warm_start import warm_start_config

ENVS = ("frozenlake", "sokoban")


def _settings(config: StarPOConfig) -> dict:
    return {key: value for key, value in config.to_dict().items() if not callable(value)}


@pytest.mark.parametrize("env", ENVS)
def test_the_examples_config_is_the_cpu_preset_setting_for_setting(env):
    example = load_script(ROOT / "tuned_examples" / f"{env}_starpo.py")
    shown, preset = _settings(getattr(example, f"{env}_config")()), _settings(cpu_preset(env))
    assert shown == preset, {key: (shown.get(key), preset.get(key)) for key in shown.keys() | preset.keys()
                             if shown.get(key) != preset.get(key)}  # fmt: skip


@pytest.mark.parametrize("env", ENVS)
def test_the_examples_warm_start_is_the_one_the_cli_derives(env):
    example = load_script(ROOT / "tuned_examples" / f"{env}_starpo.py")
    preset = cpu_preset(env)
    assert warm_start_config(preset, tuned=example.WARM_START) == warm_start_config(preset)
    # The warm-start flags still win: another player drops the example's choices, a state count replaces its.
    assert warm_start_config(preset, tuned=example.WARM_START, player="random") == warm_start_config(
        preset, player="random"
    )
    assert warm_start_config(preset, tuned=example.WARM_START, num_examples=7).num_examples == 7


@pytest.mark.parametrize("env", ENVS)
def test_the_examples_run_settings_are_the_tuned_runs(env):
    """The `main(...)` call's keywords: the same description, threshold, iterations and job budget."""
    tree = ast.parse((ROOT / "tuned_examples" / f"{env}_starpo.py").read_text())
    (call,) = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "main"]
    keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords if isinstance(k.value, ast.Constant)}
    assert keywords.pop("env") == env
    assert keywords == dataclasses.asdict(TUNED_RUNS[env])


def test_a_changed_setting_in_the_example_would_be_caught(monkeypatch):
    """The negative control: the comparison sees one setting off."""
    example = load_script(ROOT / "tuned_examples" / "frozenlake_starpo.py")
    assert _settings(example.frozenlake_config().training(actor_lr=4e-5)) != _settings(cpu_preset("frozenlake"))


def test_the_self_play_examples_evaluate_on_seeds_their_training_never_plays(monkeypatch):
    from rllib_ragen.algorithm.validation import check_seeds_apart

    monkeypatch.syspath_prepend(str(ROOT / "tuned_examples"))  # the Kuhn example builds on the TicTacToe one's
    tictactoe = load_script(ROOT / "tuned_examples" / "tictactoe_selfplay.py").tictactoe_selfplay_config()
    kuhn = load_script(ROOT / "tuned_examples" / "kuhn_poker_selfplay.py").kuhn_poker_selfplay_config()
    for config in (tictactoe, kuhn):
        check_seeds_apart(config, iterations=None)
