"""StarPOConfig: one source per default, every setting reachable, RLlib knobs StarPO ignores refused,
estimators that declare their needs, and validation that builds and reads nothing."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from ray.rllib.algorithms.algorithm_config import NotProvided

from envs import register_env
from envs.corridor import CorridorEnv
from rllib_ragen.algorithm.ignored_rllib_settings import IGNORED_RLLIB_SETTINGS
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.models import ModelNotFoundError
from rllib_ragen.training.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageSettings,
    compute_advantages,
    register_advantage_estimator,
    unregister_advantage_estimator,
)
from rllib_ragen.training.losses import LossSettings


def test_the_config_holds_each_group_at_its_own_defaults():
    config = StarPOConfig()
    groups = {name: value for name, value in vars(config).items() if dataclasses.is_dataclass(value)}
    assert {name: type(group)() for name, group in groups.items()} == groups
    assert (config.rollout.n_groups, config.loss.kl_type, config.rollout_engine.kind) == (8, "k3", "auto")


def test_a_bad_value_fails_at_the_builder_naming_the_setting_and_leaves_the_group_unchanged():
    config = StarPOConfig()
    with pytest.raises(ValueError, match="kl_type must be one of"):
        config.training(kl_type="k9")
    with pytest.raises(ValueError, match="engine must be one of"):
        config.inference(engine="no-such-engine")
    with pytest.raises(ValueError, match="micro_batch_size=4 is larger than mini_batch_size=2"):
        config.training(mini_batch_size=2)
    assert config.loss == LossSettings() and config.update.mini_batch_size is None
    config.training(mini_batch_size=2, micro_batch_size=2)  # both at once: the group checks them together
    assert (config.update.mini_batch_size, config.update.micro_batch_size) == (2, 2)


def test_a_builder_replaces_only_the_fields_given_and_the_groups_travel_with_the_config():
    config = StarPOConfig().training(clip_ratio_low=0.1)
    before = config.loss
    assert config.training(entropy_coeff=0.5).loss == dataclasses.replace(before, entropy_coeff=0.5)
    assert config.training(entropy_coeff=NotProvided).loss.entropy_coeff == 0.5
    config.freeze()  # as the Algorithm does; then pickled to each learner
    learners_copy = pickle.loads(pickle.dumps(config))
    assert learners_copy.loss == config.loss and learners_copy.rollout == config.rollout


def test_to_dict_names_every_setting_and_from_dict_restores_the_groups():
    """Tune's param space, MLflow's params and RLlib's evaluation config see each setting by its name."""
    config = StarPOConfig().rollouts(n_groups=3).training(lambda_=0.9).llm(lora_rank=4).inference(engine_dtype="float16")
    named = config.to_dict()
    assert (named["n_groups"], named["lambda"], named["lora_rank"], named["engine_dtype"]) == (3, 0.9, 4, "float16")
    assert not {"rollout", "lora", "rollout_engine", "lambda_"} & named.keys()
    restored = StarPOConfig.from_dict(named)
    assert all(getattr(restored, name) == group for name, group in vars(config).items() if dataclasses.is_dataclass(group))
    space = {**named, "group_size": 2, "actor_lr": 1e-3}  # a Tune trial's config
    trial = StarPOConfig().update_from_dict(space)
    assert (trial.rollout.group_size, trial.optim.actor_lr, trial.rollout.n_groups) == (2, 1e-3, 3)


def test_a_setting_set_as_an_attribute_is_refused_at_validation():
    config = StarPOConfig()
    config.n_groups = 4  # reads nothing: the setting lives in config.rollout
    with pytest.raises(ValueError, match=r"'n_groups' is set as an attribute of the config"):
        config.validate_starpo()


@pytest.mark.parametrize(
    "builder, setting, group, value",
    [
        ("inference", "num_cpus_per_engine", "rollout_engine", 0.5),
        ("training", "whiten_advantages", "advantages", False),
        ("training", "grpo_norm_by_std", "advantages", False),
        ("inference", "torch_threads", "update", 2),
        ("llm", "lora_dropout", "lora", 0.1),
    ],
)
def test_settings_are_reachable_through_the_builders(builder, setting, group, value):
    config = getattr(StarPOConfig(), builder)(**{setting: value})
    assert getattr(getattr(config, group), setting.removeprefix("lora_")) == value


def test_advantage_hparams_reach_the_estimator():
    # One group, scores 3 and 1: mean 2, std sqrt(2); eps=1 gives +-1 / (sqrt(2) + 1).
    settings = dataclasses.replace(AdvantageSettings(), advantage_estimator="grpo", advantage_hparams={"eps": 1.0})
    assert settings.hparams() == {"grpo_norm_by_std": True, "eps": 1.0}
    inputs = AdvantageInputs(
        rewards=torch.tensor([[0.0, 3.0], [0.0, 1.0]]), generated_mask=torch.ones(2, 2), group_ids=torch.tensor([0, 0])
    )
    advantages, _ = compute_advantages("grpo", inputs, **settings.hparams())
    expected = 1 / (2**0.5 + 1)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([expected, -expected]))
    with pytest.raises(ValueError, match=r"advantage_hparams \['high_level_lambda'\] are not hyper-parameters of .*'grpo'"):
        StarPOConfig().training(advantage_estimator="grpo", advantage_hparams={"high_level_lambda": 0.9})
    config = StarPOConfig().training(advantage_estimator="bi_level_gae", advantage_hparams={"high_level_lambda": 0.9})
    assert config.advantages.hparams()["high_level_lambda"] == 0.9


@pytest.mark.parametrize("name", sorted(IGNORED_RLLIB_SETTINGS))
def test_an_rllib_knob_starpo_ignores_is_refused_naming_starpos(name):
    message = rf"StarPO does not use RLlib's {name}; set {IGNORED_RLLIB_SETTINGS[name].split(' ')[0]}"
    with pytest.raises(ValueError, match=message):
        StarPOConfig().training(**{name: 7})
    if name == "train_batch_size_per_learner":  # derived from train_batch_size when unset
        return
    config = StarPOConfig()
    setattr(config, name, 7)  # e.g. from a dict of settings
    with pytest.raises(ValueError, match=message):
        config.validate_starpo()
    config = StarPOConfig().learners(num_learners=2)  # RLlib derives its per-learner batch from it
    config.validate()


def test_lr_names_the_learning_rates():
    with pytest.raises(ValueError, match=r"RLlib's lr; set actor_lr and critic_lr \(.training\(\)\)"):
        StarPOConfig().training(lr=1e-4)


def test_a_registered_estimator_declares_its_critic_and_hparams():
    def scaled(inputs: AdvantageInputs, *, scale: float = 2.0):
        return inputs.values * scale, inputs.values

    register_advantage_estimator("scaled_values", scaled, needs_critic=True)
    try:
        config = StarPOConfig().training(advantage_estimator="scaled_values", advantage_hparams={"scale": 3.0})
        assert config.advantages.needs_critic
        assert config.advantages.hparams() == {"scale": 3.0}
        config.llm(critic="none")
        with pytest.raises(ValueError, match=r"'scaled_values' needs a critic.*\['arpo', 'brpo', 'grpo', 'rae'\]"):
            config.validate_starpo()
    finally:
        unregister_advantage_estimator("scaled_values")
    assert "scaled_values" not in ADVANTAGE_ESTIMATORS


class _CountingEnv(CorridorEnv):
    built = 0

    def __init__(self, *args, **kwargs) -> None:
        type(self).built += 1
        super().__init__(*args, **kwargs)


def test_validation_builds_no_env_and_reads_no_model(tmp_path):
    register_env("counting_corridor", _CountingEnv, overwrite=True)
    config = StarPOConfig().environment("counting_corridor").llm(model=str(tmp_path / "missing"), critic="head")
    config.validate_starpo()
    assert _CountingEnv.built == 0
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        config.check_inputs()
    with pytest.raises(ValueError, match=r"rejects env_config .*'no_such_key'"):
        config.environment("counting_corridor", env_config={"no_such_key": 1}).validate_starpo()
    assert _CountingEnv.built == 0


def test_cpu_frozenlake_preset_trains_the_readable_variant_in_one_on_policy_step():
    """The main job's settings: deterministic ice in words, one move a turn on a Markov prompt, and an update
    that needs no pass to score old log-probs (every row the filter can keep fits one mini-batch)."""
    from envs import make_env
    from rllib_ragen.algorithm.presets import cpu_preset

    config = cpu_preset("frozenlake")
    config.validate()
    assert make_env("frozenlake", **config.env_config).config.render == "words"
    assert config.env_config == {"is_slippery": False, "render": "words"}
    assert (config.protocol.max_actions_per_turn, config.protocol.history_window, config.protocol.think) == (1, 0, False)
    assert config.max_rows_per_update == 4 * 4 * 5 and config.update.mini_batch_size is None
    assert config.update.rows_per_step(37) == 37  # one step over whatever rows the filter kept
    assert config.update_is_one_on_policy_step


def test_cpu_sokoban_preset_trains_the_rooms_in_words_one_move_a_turn():
    from envs import make_env
    from rllib_ragen.algorithm.presets import cpu_preset

    config = cpu_preset("sokoban")
    config.validate()
    assert make_env("sokoban", **config.env_config).config.render == "words"
    assert (config.turn_budget.max_turns, config.protocol.max_actions_per_turn, config.turn_budget.max_actions_per_traj) == (8, 1, 8)
    assert (config.protocol.history_window, config.protocol.think, config.advantages.advantage_estimator) == (0, False, "grpo")
    assert config.max_rows_per_update == 4 * 4 * 8 and config.update.mini_batch_size is None
    assert cpu_preset("larger_sokoban").env_config == {}


def test_a_mini_batch_never_repeats_rows_and_a_too_large_one_is_named_in_one_line(caplog):
    from rllib_ragen.algorithm.presets import cpu_preset

    config = cpu_preset("bandit")
    assert config.update.mini_batch_size is None and config.update.rows_per_step(32) == 32 and config.update.rows_per_step(5) == 5
    config.training(mini_batch_size=8)
    assert (config.update.rows_per_step(32), config.update.rows_per_step(5)) == (8, 5)  # never 8 rows out of 5
    with caplog.at_level("WARNING"):
        config.training(mini_batch_size=100).validate()
    lines = [r.getMessage() for r in caplog.records if "mini_batch_size=100" in r.getMessage()]
    assert len(lines) == 1 and "at most 32 rows" in lines[0] and "none repeated" in lines[0]
    assert config.update.rows_per_step(32) == 32


def test_evaluation_seeds_that_training_would_play_are_refused_and_self_plays_games_count():
    from rllib_ragen.algorithm.validation import check_seeds_apart

    config = StarPOConfig().rollouts(n_groups=16).starpo_evaluation(eval_size=8, eval_seed=9990)
    check_seeds_apart(config, iterations=None)  # 9990..9997: below the training seeds from 10000
    # Self-play also plays game_eval_games = 128 games from eval_seed: 9990..10117 reach them.
    config.self_play(self_play_game="TicTacToe-v0")
    with pytest.raises(ValueError, match=r"evaluation seeds 9990\.\.10117 overlap the training seeds 10000\.\."):
        check_seeds_apart(config, iterations=None)
    with pytest.raises(ValueError, match=r"overlap the training seeds 10000\.\.10015"):
        check_seeds_apart(config, iterations=1)  # one iteration trains on seeds 10000..10015
    config.starpo_evaluation(eval_seed=10016)
    check_seeds_apart(config, iterations=1)  # 10016..10143: above the one iteration's seeds
    with pytest.raises(ValueError, match=r"overlap the training seeds 10000\.\.10031"):
        check_seeds_apart(config, iterations=2)

