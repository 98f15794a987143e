"""The world-model stage's data (the env's true next state after each demonstrated turn) and the warm start
that trains on it first."""

import pytest
import torch

from rllib_ragen.data.demonstrations import group_and_protocol
from rllib_ragen.data.world_model import transition_question, transition_trajectories
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.run.warm_start import WarmStartSettings, demonstrations, warm_start
from rllib_ragen.training.behaviour_cloning import SupervisedSettings, answer_nll, cloning_passes

AGENT = "traj_0"
PROTOCOL = ProtocolSettings(max_actions_per_turn=2, think=False, prefill=True)
BUDGET = TurnBudgetSettings(max_turns=3, max_actions_per_traj=6)


def _settings(**changes) -> WarmStartSettings:
    fields = dict(env="frozenlake", protocol=PROTOCOL, budget=BUDGET, num_examples=6, player="random", seed=3)
    return WarmStartSettings(**{**fields, **changes})


def test_each_transition_asks_the_state_and_moves_and_targets_the_envs_next_state(tiny_tokenizer):
    config = _settings()
    episodes = demonstrations(tiny_tokenizer, config)
    _, protocol = group_and_protocol(tiny_tokenizer, "frozenlake", {}, PROTOCOL, BUDGET)
    transitions = transition_trajectories(episodes, protocol)
    expected = []  # (state, moves, next state) of every turn, read straight from the episodes
    for episode in episodes:
        agent = episode.agent_episodes[AGENT]
        states, infos = agent.get_observations(), agent.get_infos()
        expected += [(states[t], infos[t + 1]["parsed_actions"], states[t + 1]) for t in range(len(agent))]
    assert len(transitions) == len(expected) > len(episodes)
    for trajectory, (state, moves, next_state) in zip(transitions, expected):
        ((ids, mask, _),) = trajectory.history.training_rows()
        trained = [i for i, m in zip(ids, mask) if m]
        assert tiny_tokenizer.decode(trained[:-1]) == next_state and trained[-1] == protocol.template.eos_token_id
        prompt = tiny_tokenizer.decode(ids[: mask.index(1)])
        assert prompt.startswith(tiny_tokenizer.decode(protocol.system_ids))
        assert transition_question(state, moves) in prompt and next_state not in prompt.split("Moves:")[1]


def test_the_stage_is_off_by_default_and_keeps_earlier_cache_keys():
    assert _settings().fingerprint("m") != _settings(world_model_epochs=1).fingerprint("m")
    assert _settings().world_model_epochs == 0
    with pytest.raises(ValueError, match="world_model_epochs"):
        _settings(world_model_epochs=-1)


def _next_state_nll(model_path, rows_source) -> float:
    policy = load_causal_lm(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        nlls = [answer_nll(policy, rows, SupervisedSettings(lr=1.0)) for batch in rows_source for rows in batch]
    return float(sum(nlls) / len(nlls))


def test_a_world_model_stage_teaches_the_next_state_that_the_answers_alone_do_not(
    tiny_model_path, tiny_tokenizer, tmp_path
):
    """Same demonstrations, same answer epochs: the model that had the stage writes the env's next states
    with a lower NLL than the one that did not (the negative control)."""
    without = warm_start(str(tiny_model_path), _settings(lr=3e-3), cache_dir=tmp_path)
    with_stage = warm_start(str(tiny_model_path), _settings(lr=3e-3, world_model_epochs=3), cache_dir=tmp_path)
    assert with_stage != without
    _, protocol = group_and_protocol(tiny_tokenizer, "frozenlake", {}, PROTOCOL, BUDGET)
    transitions = transition_trajectories(demonstrations(tiny_tokenizer, _settings()), protocol)
    rows = list(cloning_passes(transitions, trajectories_per_pass=8, rows_per_step=8, epochs=1))
    learnt, control = _next_state_nll(with_stage, rows), _next_state_nll(without, rows)
    print(f"next-state NLL with the stage {learnt:.3f}, without {control:.3f}")
    assert learnt < control - 0.5
