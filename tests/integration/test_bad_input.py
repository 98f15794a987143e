"""Bad input is caught before any work starts (no engine, no learner built),
with an error that names the problem."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from run_helpers import driver_args, tiny_config

from envs import register_env
from envs.base import TextEnv
from rllib_ragen.models import ModelNotFoundError
from rllib_ragen.rollout import env_runner
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.run.flags import config_from_args


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda c: c.environment("sokobann"), "unknown env 'sokobann'"),
        # Remote runners: the same message, on the driver, when the algorithm is built.
        (lambda c: c.environment("sokobann").env_runners(num_env_runners=1, create_local_env_runner=False),
         r"^unknown env 'sokobann'; registered envs"),
        (lambda c: c.environment("mod_missing:Env").env_runners(num_env_runners=1, create_local_env_runner=False),
         "cannot import module 'mod_missing'"),
        (lambda c: c.environment("sokoban", env_config={"dim_rom": (5, 5)}), r"rejects env_config .*'dim_rom'"),
        (lambda c: c.environment("countdown", env_config={"num_numbers": 9}), "num_numbers must be between 2 and 6"),
        (lambda c: c.rollouts(max_turns=0), "max_turns must be >= 1"),
        (lambda c: c.rollouts(max_actions_per_turn=0), "max_actions_per_turn must be >= 1"),
        (lambda c: c.rollouts(max_actions_per_traj=0), "max_actions_per_traj must be >= 1"),
        (lambda c: c.rollouts(response_length=0), "response_length must be >= 1"),
        (lambda c: c.rollouts(env_step_timeout_s=0), "env_step_timeout_s must be > 0"),
        (lambda c: c.training(rollout_filter_ratio=0.0), "rollout_filter_ratio must be in"),
        (lambda c: c.training(mini_batch_size=4, micro_batch_size=8),
         "micro_batch_size=8 is larger than mini_batch_size=4"),
        (lambda c: c.inference(max_model_len=12),
         "max_model_len=12 leaves no room for a prompt with response_length=12"),
    ],
)
def test_bad_config_is_named_before_anything_is_built(tiny_model_path, change, message):
    """At the builder call (a group's own check) or at validation (a check across groups or the env's)."""
    config = tiny_config(tiny_model_path)
    with pytest.raises(ValueError, match=message):
        change(config)
        config.validate_starpo()


@pytest.mark.parametrize(
    "ratio,history_window,mini_batch,rows",
    [
        (0.25, None, 4, 2),  # keeps max(1, floor(0.25 x 2)) = 1 group of 2 trajectories
        (1.0, None, 5, 4),  # keeps both groups: 4 trajectories
        (1.0, 1, 9, 8),  # one row per turn: 4 trajectories x 2 turns
    ],
)
def test_mini_batch_larger_than_an_update_warns(tiny_model_path, caplog, ratio, history_window, mini_batch, rows):
    config = tiny_config(tiny_model_path).rollouts(history_window=history_window)
    config.training(rollout_filter_ratio=ratio, mini_batch_size=mini_batch)
    with caplog.at_level(logging.WARNING, logger="rllib_ragen.algorithm.validation"):
        config.validate_starpo()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"mini_batch_size={mini_batch} is larger than the at most {rows} rows an update gets" in warning
    caplog.clear()
    config.training(mini_batch_size=rows, micro_batch_size=2).validate_starpo()
    assert not caplog.records


def test_unknown_set_key_names_it():
    with pytest.raises(ValueError, match="unknown config key 'actor_lrr'"):
        config_from_args(driver_args("--set", "actor_lrr=1e-5"))


@pytest.mark.parametrize(
    "assignment,message",
    [
        ("actor_lr=abc", r"--set actor_lr=abc: actor_lr takes float \(a number, e.g. 1e-5\), got 'abc'"),
        ("history_window=x", r"--set history_window=x: history_window takes int \| None \(an integer or None\)"),
        ("history_window=1.5", r"history_window takes int \| None"),
        ("n_groups=2.5", r"n_groups takes int \(an integer\)"),
        ("n_groups=None", r"n_groups takes int \(an integer\)"),
        ("think=1", r"think takes bool \(True or False\)"),
        ("adam_betas=0.9", r"adam_betas takes tuple\[float, float\] \(a list or tuple"),
        ("advantage_hparams=3", r"advantage_hparams takes Mapping\[str, Any\] \(a dict"),
        ("num_env_runners=x", r"num_env_runners takes int \(an integer or None\)"),
    ],
)
def test_set_value_of_the_wrong_type_names_the_setting_and_its_type(assignment, message):
    with pytest.raises(ValueError, match=message):
        config_from_args(driver_args("--set", assignment))


def test_set_values_take_the_settings_types():
    config = config_from_args(driver_args(
        "--set", "actor_lr=1", "--set", "history_window=2", "--set", "engine_dtype=bfloat16", "--set", "kl_type=k1",
        "--set", "micro_batch_tokens=None", "--set", "autocast_dtype=None", "--set", "adam_betas=[0.8, 0.9]",
        "--set", "lora_target_modules=('q_proj', 'v_proj')", "--set", "advantage_hparams={}",
    ))
    assert config.optim.adam_betas == (0.8, 0.9) and config.lora.target_modules == ("q_proj", "v_proj")
    assert config.advantages.advantage_hparams == {}
    assert config.optim.actor_lr == 1.0 and isinstance(config.optim.actor_lr, float) and config.protocol.history_window == 2
    assert (config.rollout_engine.dtype, config.loss.kl_type, config.update.micro_batch_tokens) == ("bfloat16", "k1", None)
    assert config.scoring.autocast_dtype is None


def test_model_dir_without_tokenizer_or_chat_template(tiny_model_path, tmp_path):
    no_tokenizer = Path(shutil.copytree(tiny_model_path, tmp_path / "no_tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    with pytest.raises(ModelNotFoundError, match="has no tokenizer files"):
        tiny_config(no_tokenizer).check_inputs()
    no_template = Path(shutil.copytree(tiny_model_path, tmp_path / "no_template"))
    tokenizer_config = json.loads((no_template / "tokenizer_config.json").read_text())
    del tokenizer_config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    with pytest.raises(ValueError, match="has no chat template"):
        tiny_config(no_template).check_inputs()
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        tiny_config(tmp_path / "missing").check_inputs()


@pytest.fixture
def no_engine(monkeypatch):
    """Fails the test if the runner gets as far as building its engine."""

    def refuse(*args, **kwargs):
        raise AssertionError("the engine was built before the bad input was found")

    monkeypatch.setattr(env_runner, "make_engine", refuse)


def test_first_prompt_longer_than_the_model_is_an_error_at_start(tiny_model_path, no_engine):
    # Sokoban's first prompt is ~250 tokens: with 12 for the answer, 200 positions are too few.
    config = tiny_config(tiny_model_path).inference(max_model_len=200)
    config.validate_starpo()
    message = r"first prompt of env 'sokoban' \(seed 10000\) is \d+ tokens.*max_model_len=200"
    with pytest.raises(ValueError, match=message):
        LLMEnvRunner(config=config)


class _BrokenResetEnv(TextEnv):
    instructions = "Nothing works."

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> dict[str, Any]:
        raise OSError("level file missing")

    def _step(self, action: str):
        raise AssertionError("never reached")

    def render_text(self) -> str:
        return ""


def test_env_that_cannot_reset_is_an_error_at_start(tiny_model_path, no_engine):
    register_env("broken_reset", _BrokenResetEnv, overwrite=True)
    config = tiny_config(tiny_model_path, env="broken_reset")
    message = r"'broken_reset' cannot reset with seed 10000: .*OSError: level file missing"
    with pytest.raises(RuntimeError, match=message):
        LLMEnvRunner(config=config)
