"""The format warm start: random multi-turn play, behaviour-cloned in the supervised loop, then a model that follows
the format."""

import dataclasses

import numpy as np
import pytest
import torch

from envs import make_env
from rllib_ragen.algorithm.offline_training import response_token_nll
from rllib_ragen.models import load_causal_lm, load_tokenizer
from rllib_ragen.rollout.env_group import RolloutSettings, TurnBudgetSettings
from rllib_ragen.rollout.evaluation import EvalSettings
from rllib_ragen.rollout.prompt.prompt_protocol import PromptProtocol, ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.trajectory_record import trajectory_start, turn_record
from rllib_ragen.run.warm_start import WarmStartSettings, demonstration_seeds, demonstrations, warm_start

AGENT = "traj_0"
PROTOCOL = ProtocolSettings(max_actions_per_turn=3, think=True)


def _protocol(tokenizer, env_name, protocol_settings):
    env = make_env(env_name)
    return PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer),
        instructions=env.instructions,
        action_vocabulary=env.action_vocabulary,
        config=protocol_settings,
    )


def test_demonstrations_is_multi_turn_well_formed_and_random(tiny_tokenizer):
    budget = TurnBudgetSettings(max_turns=3, max_actions_per_traj=9)
    config = WarmStartSettings(env="sokoban", protocol=PROTOCOL, budget=budget, num_examples=20, answers_per_prompt=2)
    episodes = demonstrations(tiny_tokenizer, config)
    assert len(episodes) == 40
    protocol = _protocol(tiny_tokenizer, "sokoban", PROTOCOL)
    chosen, turns = [], []
    for episode in episodes:
        trajectory = episode.agent_episodes[AGENT]
        turns.append(len(trajectory))
        for t in range(len(trajectory)):
            response = trajectory.get_actions(t).tolist()
            assert response[-1] == protocol.template.eos_token_id
            text, parsed = protocol.parse(response)
            assert text == turn_record(trajectory, t).response_text
            assert parsed.format_ok and 1 <= len(parsed.actions) <= 3 and not parsed.invalid_actions
            chosen.extend(parsed.actions)
    # Multi-turn: rooms are rarely solved by chance, so most trajectories use the whole turn budget.
    assert max(turns) == 3 and np.mean(turns) > 2
    # Random, not one fixed answer: every move shows up, none dominates.
    counts = {a: chosen.count(a) for a in ("Up", "Down", "Left", "Right")}
    assert min(counts.values()) > 0.15 * len(chosen), counts
    # Two trajectories per initial state, played differently.
    assert (
        episodes[0].agent_episodes[AGENT].get_infos(0)["seed"] == episodes[1].agent_episodes[AGENT].get_infos(0)["seed"]
    )


def _first_prompts(episodes):
    prompts = []
    for episode in episodes:
        trajectory = episode.agent_episodes[AGENT]
        prompts.append([*trajectory_start(trajectory).system_ids, *turn_record(trajectory, 0).user_ids])
    return prompts


def _valid_ratio(lm, prompts, protocol, *, samples=4):
    torch.manual_seed(0)
    valid = 0
    for prompt in prompts:
        ids = torch.tensor([prompt] * samples)
        out = lm.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=True,
            eos_token_id=protocol.template.eos_token_id,
            pad_token_id=protocol.template.eos_token_id,
        )
        valid += sum(protocol.parse(row[len(prompt) :].tolist())[1].has_valid_action for row in out)
    return valid / (samples * len(prompts))


@pytest.mark.slow  # 4 epochs of behaviour cloning, then sampling from both models
def test_warm_start_teaches_the_format_and_is_cached(tiny_model_path, tmp_path):
    protocol = ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True)
    budget = TurnBudgetSettings(max_turns=1, max_actions_per_traj=1)
    # One pair of names (RAGEN v1's): a random tiny model learns the format, not 24 names.
    config = WarmStartSettings(
        env="bandit_phoenix_dragon",
        protocol=protocol,
        budget=budget,
        num_examples=64,
        answers_per_prompt=4,
        epochs=4,
        batch_size=8,
        lr=3e-3,
    )
    path = warm_start(str(tiny_model_path), config, cache_dir=tmp_path)
    built = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert warm_start(str(tiny_model_path), config, cache_dir=tmp_path) == path  # built once, then reused
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == built
    tokenizer = load_tokenizer(path)
    proto = _protocol(tokenizer, config.env, protocol)
    held_out = _first_prompts(demonstrations(tokenizer, dataclasses.replace(config, num_examples=8, seed=99)))
    assert _valid_ratio(load_causal_lm(tiny_model_path), held_out, proto) == 0.0
    assert _valid_ratio(load_causal_lm(path), held_out, proto) >= 0.8


def test_demonstrations_never_play_an_evaluation_held_out_or_training_state():
    # A warm start of 4096 states (more than any preset plays) against the default evaluation seeds, the
    # benchmarks' held-out seeds (50_000..) and a long run's training seeds (train_seed_start..).
    seeds = set(demonstration_seeds(WarmStartSettings(num_examples=4096)))
    evaluation = EvalSettings()
    scored = set(range(evaluation.eval_seed, evaluation.eval_seed + 10_000)) | set(range(50_000, 60_000))
    training = set(range(RolloutSettings().train_seed_start, RolloutSettings().train_seed_start + 100_000))
    assert len(seeds) == 4096 and not seeds & scored and not seeds & training
    assert set(demonstration_seeds(WarmStartSettings(num_examples=8, seed=1))).isdisjoint(seeds)
    # A chosen first seed (the same demonstrations as an earlier warm start, e.g. seeds 0..47) is played.
    assert demonstration_seeds(WarmStartSettings(num_examples=3, first_seed=0)) == [0, 1, 2]
    with pytest.raises(ValueError, match="first_seed"):
        WarmStartSettings(first_seed=-1)


def test_the_cache_key_depends_on_model_and_prompt_format():
    config = WarmStartSettings(env="bandit")
    assert config.fingerprint("a") != config.fingerprint("b")
    no_think = WarmStartSettings(env="bandit", protocol=ProtocolSettings(think=False))
    assert config.fingerprint("a") != no_think.fingerprint("a")
    assert config.fingerprint("a") == WarmStartSettings(env="bandit").fingerprint("a")


@pytest.mark.parametrize("field", ["num_examples", "answers_per_prompt", "epochs", "batch_size"])
def test_bad_sizes_are_refused_by_name(field):
    with pytest.raises(ValueError, match=field):
        WarmStartSettings(**{field: 0})


def _bandit_pair(seed: int) -> tuple[str, str]:
    env = make_env("bandit")
    env.reset(seed=seed)
    return env.pair


def test_each_state_opens_with_every_action_equally_often(tiny_tokenizer):
    protocol = ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True)
    budget = TurnBudgetSettings(max_turns=1, max_actions_per_traj=1)
    config = WarmStartSettings(env="bandit", protocol=protocol, budget=budget, num_examples=16, answers_per_prompt=2)
    episodes = demonstrations(tiny_tokenizer, config)
    arms = [e.agent_episodes[AGENT].get_infos(1)["arm"] for e in episodes]
    pairs = [_bandit_pair(e.agent_episodes[AGENT].get_infos(0)["seed"]) for e in episodes[0::2]]
    # Per state (consecutive episodes) one of each arm of its pair, in a random order.
    assert all(sorted(arms[2 * i : 2 * i + 2]) == sorted(pair) for i, pair in enumerate(pairs))
    assert len(set(pairs)) > 1
    high_first = [arm == pair[1] for arm, pair in zip(arms[0::2], pairs)]
    assert sum(high_first) not in (0, 16)


def test_a_top_layers_warm_start_trains_only_those_and_learns(tiny_model_path, tmp_path):
    """The tiny model's last of 2 layers (and final norm) move and its NLL falls; the embeddings (tied to
    the LM head) and the first layer stay the base model's bit for bit."""
    config = WarmStartSettings(
        env="bandit_phoenix_dragon",
        protocol=ProtocolSettings(max_actions_per_turn=1, think=False, prefill=True),
        budget=TurnBudgetSettings(max_turns=1, max_actions_per_traj=1),
        num_examples=32,
        answers_per_prompt=2,
        epochs=2,
        batch_size=8,
        lr=3e-3,
        trained_top_layers=1,
    )
    base = load_causal_lm(tiny_model_path).state_dict()
    path = warm_start(str(tiny_model_path), config, cache_dir=tmp_path)
    trained = load_causal_lm(path).state_dict()
    moved = {name for name, value in trained.items() if not torch.equal(value, base[name])}
    assert moved and all(name.startswith(("model.layers.1.", "model.norm.")) for name in moved)
    assert "model.embed_tokens.weight" not in moved and not any(name.startswith("model.layers.0.") for name in moved)
    tokenizer = load_tokenizer(tiny_model_path)
    episodes = demonstrations(tokenizer, config)
    before = response_token_nll(load_causal_lm(tiny_model_path), episodes, history_window=None)
    after = response_token_nll(load_causal_lm(path), episodes, history_window=None)
    assert after < before


def test_no_top_layers_is_refused():
    with pytest.raises(ValueError, match="trained_top_layers"):
        WarmStartSettings(trained_top_layers=0)


def test_the_expert_default_is_many_states_once_on_the_top_layers_and_random_play_every_weight():
    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.run.warm_start import warm_start_config

    expert = warm_start_config(cpu_preset("frozenlake"))
    assert (expert.player, expert.num_examples, expert.epochs, expert.trained_top_layers) == ("expert", 384, 1, 10)
    # The grid envs' tuned warm starts play twice the other envs' states (EXPERT_STATES_BY_ENV).
    assert warm_start_config(cpu_preset("sokoban")).num_examples == 384
    assert warm_start_config(cpu_preset("corridor")).num_examples == 192
    random_play = warm_start_config(cpu_preset("frozenlake"), player="random")
    assert (random_play.num_examples, random_play.epochs, random_play.trained_top_layers) == (16, 2, None)
    # The same setting for a 2-layer test model: a model of 10 layers or fewer trains every weight.
    tiny = warm_start_config(cpu_preset("frozenlake").llm(model="tiny-random"))
    assert tiny.trained_top_layers == 10
