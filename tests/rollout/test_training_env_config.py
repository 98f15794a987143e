"""`train_env_overrides`: training rollouts play the env config with the overrides on top (a curriculum),
evaluation always plays the standard `env_config`."""

from __future__ import annotations

import pytest

from envs import make_env
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rollout.env_group import RolloutSettings, training_env_config
from rllib_ragen.rollout.env_runner import LLMEnvRunner

SEED = 7


def test_overrides_replace_the_env_configs_entries():
    settings = RolloutSettings(train_env_overrides={"search_depth": 5, "render": "grid"})
    assert training_env_config({"render": "words", "num_boxes": 1}, settings) == {
        "render": "grid", "num_boxes": 1, "search_depth": 5,
    }
    env_config = {"render": "words"}
    assert training_env_config(env_config, RolloutSettings()) == env_config
    assert training_env_config(None, RolloutSettings()) == {}


def test_bad_overrides_are_refused_by_name():
    with pytest.raises(ValueError, match="train_env_overrides must be a dict"):
        RolloutSettings(train_env_overrides=[("search_depth", 5)])
    config = StarPOConfig().environment("sokoban").rollouts(train_env_overrides={"search_dept": 5})
    with pytest.raises((TypeError, ValueError), match="search_dept"):
        config.validate_starpo()


def _first_observation(episodes) -> str:
    (episode,) = episodes
    (trajectory,) = episode.agent_episodes.values()
    return str(trajectory.get_observations(0))


def test_the_runner_trains_on_the_overrides_and_evaluates_on_the_standard_rooms(tiny_model_path):
    words = {"render": "words"}
    config = (
        StarPOConfig()
        .environment("sokoban", env_config=words)
        .llm(model=str(tiny_model_path), critic="none")
        .rollouts(n_groups=1, group_size=1, max_turns=1, response_length=4, think=False,
                  train_env_overrides={"search_depth": 2})
        .inference(engine="hf")
    )
    runner = LLMEnvRunner(config=config)
    try:
        trained = _first_observation(runner.sample(seeds=[SEED], group_size=1))
        evaluated = _first_observation(runner.sample(seeds=[SEED], group_size=1, evaluation=True))
    finally:
        runner.stop()
    easy_room = make_env("sokoban", render="words", search_depth=2).reset(seed=SEED)[0]
    standard_room = make_env("sokoban", render="words").reset(seed=SEED)[0]
    assert easy_room != standard_room  # the override changes the room this seed draws
    assert trained == str(easy_room)
    assert evaluated == str(standard_room)
