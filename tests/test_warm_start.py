"""The format warm start: random well-formed answers, then a model that follows the format."""

import torch

from rllib_ragen.connectors.chat_template import ChatTemplate
from rllib_ragen.connectors.protocol import PromptProtocol, ProtocolConfig
from rllib_ragen.env_group import TurnBudget
from rllib_ragen.models import load_causal_lm, load_tokenizer
from rllib_ragen.warm_start import WarmStartConfig, format_examples, warm_start

PROTOCOL = ProtocolConfig(max_actions_per_turn=3, think=True)


def _protocol(tokenizer, env):
    return PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer), instructions=env.instructions,
        action_vocabulary=env.action_vocabulary, config=PROTOCOL,
    )


def test_examples_are_well_formed_random_and_parse_back(tiny_tokenizer):
    from envs import make_env

    env = make_env("sokoban")
    protocol = _protocol(tiny_tokenizer, env)
    examples = format_examples(protocol, WarmStartConfig(env="sokoban", protocol=PROTOCOL, num_examples=40))
    chosen = []
    for prompt, response in examples:
        assert prompt[: len(protocol.system_ids)] == protocol.system_ids
        assert response[-1] == protocol.template.eos_token_id
        _, parsed = protocol.parse(response)
        assert parsed.format_ok and 1 <= len(parsed.actions) <= 3 and not parsed.invalid_actions
        chosen.extend(parsed.actions)
    # Random, not a fixed answer: every action shows up.
    assert set(chosen) == {"Up", "Down", "Left", "Right"}


def test_warm_start_teaches_the_format_and_is_cached(tiny_model_path, tmp_path):
    protocol = ProtocolConfig(max_actions_per_turn=1, think=False, prefill=True)
    config = WarmStartConfig(
        env="bandit", protocol=protocol, budget=TurnBudget(max_turns=1, max_actions_per_traj=1),
        num_examples=64, answers_per_prompt=4, epochs=4, batch_size=8, lr=3e-3,
    )
    path = warm_start(str(tiny_model_path), config, cache_dir=tmp_path)
    assert warm_start(str(tiny_model_path), config, cache_dir=tmp_path) == path  # built once
    from envs import make_env

    env = make_env("bandit")
    tokenizer = load_tokenizer(path)
    proto = PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer), instructions=env.instructions,
        action_vocabulary=env.action_vocabulary, config=protocol,
    )
    held_out = format_examples(proto, WarmStartConfig(env="bandit", protocol=protocol, num_examples=8, seed=99))
    model, base = load_causal_lm(path), load_causal_lm(tiny_model_path)
    torch.manual_seed(0)

    def valid_ratio(lm):
        valid = 0
        for prompt, _ in held_out:
            ids = torch.tensor([prompt] * 4)
            out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=True, eos_token_id=2, pad_token_id=2)
            valid += sum(proto.parse(row[len(prompt):].tolist())[1].has_valid_action for row in out)
        return valid / (4 * len(held_out))

    assert valid_ratio(base) == 0.0
    assert valid_ratio(model) >= 0.8
