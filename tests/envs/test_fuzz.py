"""Fuzz tests: arbitrary model output at the answer parser and the prompt
protocol, arbitrary action strings at every registered env.

Nothing may raise: the parser always returns a `ParsedAnswer` whose fields
are consistent with the text, and every env step returns a well-formed
5-tuple with a finite reward, flagging actions it did not understand.

Each test records how many cases it ran (`record_property("fuzz_cases", n)`,
in JUnit XML) and prints it; `pytest -rA tests/envs/test_fuzz.py` shows the
counts and the total in the normal output. Each fuzz target runs once per
session, by whichever test asks first: the total does not depend on which
tests ran before it, or on whether they were selected at all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs import list_envs, make_env
from envs.base import match_action
from rllib_ragen.rollout.prompt.answer_parser import (
    ACTION_SEPARATOR,
    ParsedAnswer,
    parse_answer,
)
from rllib_ragen.rollout.prompt.protocol import PromptProtocol, ProtocolSettings

PARSER_CASES = 400
PROTOCOL_CASES = 100
ENV_CASES = 200  # per env; each case is a reset and up to 8 steps
ENVS = list_envs()  # at collection: the built-in envs (tests register others at run time)
EXPECTED_TOTAL = PARSER_CASES + PROTOCOL_CASES + ENV_CASES * len(ENVS)

FRAGMENTS = (
    "<think>", "</think>", "<answer>", "</answer>", ACTION_SEPARATOR, "|", "<", ">", "/",
    " ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u2003",
    "Up", "down", " LEFT ", "Right", "Dragon", "phoenix", "Trader", "librarian",
    "1+2", "(3 + 5) * 2", "= 10", "9**9**9", "1/0", "(((((1", "-7", "0x10", "",
    "<|im_end|>", "<|im_start|>assistant\n", "\x00", "é", "中文", "🙂",
)

# Either unconstrained unicode, or a soup of the tags, separators and action words the
# parser looks for (which random unicode almost never hits).
model_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join),
)
# Derandomized: the same cases every run, so a count or a failure reproduces exactly.
FUZZ = settings(deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# Cases run per fuzz target, filled by `_fuzzed` (a target that raised is not in it).
_cases: dict[str, int] = {}


def _fuzzed(name: str, fuzz) -> int:
    """The number of cases `fuzz()` ran for target `name`: run on the first request, then recalled."""
    if name not in _cases:
        _cases[name] = fuzz()
    return _cases[name]


def _report(record_property, name: str, count: int, expected: int) -> None:
    record_property("fuzz_cases", count)
    print(f"fuzz {name}: {count} cases")
    assert count == expected


def _check_parsed(parsed: ParsedAnswer, text: str, *, max_actions: int, vocabulary, think: bool) -> None:
    assert isinstance(parsed, ParsedAnswer)
    assert len(parsed.actions) + len(parsed.invalid_actions) <= max_actions
    if vocabulary is not None:
        assert set(parsed.actions) <= set(vocabulary)
    assert all(a.strip() == a and a for a in parsed.actions + parsed.invalid_actions + parsed.dropped_actions)
    assert parsed.has_valid_action == (parsed.error is None)
    if not parsed.format_ok:
        assert not parsed.actions and parsed.error
    if parsed.format_ok and think:
        assert "<think>" in text and parsed.think is not None
    if "<answer>" not in text or "</answer>" not in text:
        assert not parsed.format_ok


def _fuzz_answer_parser() -> int:
    count = 0

    @settings(FUZZ, max_examples=PARSER_CASES)
    @given(
        text=model_text,
        max_actions=st.integers(1, 6),
        vocabulary=st.sampled_from([None, ("Up", "Down", "Left", "Right"), ("Dragon", "Phoenix")]),
        think=st.booleans(),
    )
    def check(text, max_actions, vocabulary, think):
        nonlocal count
        count += 1
        parsed = parse_answer(text, max_actions_per_turn=max_actions, action_vocabulary=vocabulary, think=think)
        _check_parsed(parsed, text, max_actions=max_actions, vocabulary=vocabulary, think=think)

    check()
    return count


def test_answer_parser_survives_arbitrary_text(record_property):
    _report(record_property, "answer_parser", _fuzzed("answer_parser", _fuzz_answer_parser), PARSER_CASES)


def _fuzz_prompt_protocol(chat_template, tiny_tokenizer) -> int:
    """Sampled token ids (any id of the vocabulary, specials included) decode and parse."""
    count = 0
    vocab_size = len(tiny_tokenizer)

    @settings(FUZZ, max_examples=PROTOCOL_CASES)
    @given(
        text=model_text,
        noise=st.lists(st.integers(0, vocab_size - 1), max_size=20),
        prefill=st.booleans(),
        think=st.booleans(),
    )
    def check(text, noise, prefill, think):
        nonlocal count
        count += 1
        protocol = PromptProtocol(
            chat_template, instructions="Move.", action_vocabulary=("Up", "Down"),
            config=ProtocolSettings(max_actions_per_turn=2, think=think, prefill=prefill),
        )
        response_ids = tiny_tokenizer.encode(text, add_special_tokens=False) + noise
        decoded, parsed = protocol.parse(response_ids)
        assert isinstance(decoded, str)
        _check_parsed(parsed, decoded, max_actions=2, vocabulary=("Up", "Down"), think=think)
        assert isinstance(protocol.close_ids(response_ids), list)

    check()
    return count


def test_prompt_protocol_parses_arbitrary_token_ids(record_property, chat_template, tiny_tokenizer):
    count = _fuzzed("prompt_protocol", lambda: _fuzz_prompt_protocol(chat_template, tiny_tokenizer))
    _report(record_property, "prompt_protocol", count, PROTOCOL_CASES)


def _fuzz_env(env_name: str) -> int:
    count = 0
    env = make_env(env_name)
    action = st.one_of(st.text(max_size=60), st.sampled_from(FRAGMENTS), model_text)

    @settings(FUZZ, max_examples=ENV_CASES)
    @given(seed=st.integers(0, 2**31 - 1), actions=st.lists(action, min_size=1, max_size=8))
    def check(seed, actions):
        nonlocal count
        count += 1
        observation, info = env.reset(seed=seed)
        assert isinstance(observation, str) and isinstance(info, dict)
        for text in actions:
            before = env.render_text()
            result = env.step(text)
            _check_step(env, text, result, before)
            if result[2] or result[3]:
                break

    check()
    return count


@pytest.mark.parametrize("env_name", ENVS)
def test_env_survives_arbitrary_actions(record_property, env_name):
    _report(record_property, f"env {env_name}", _fuzzed(f"env {env_name}", lambda: _fuzz_env(env_name)), ENV_CASES)


def _check_step(env, action: str, result, before: str) -> None:
    assert isinstance(result, tuple) and len(result) == 5
    observation, reward, terminated, truncated, info = result
    assert isinstance(observation, str)
    assert isinstance(reward, float) and math.isfinite(reward)
    assert isinstance(terminated, (bool, np.bool_)) and isinstance(truncated, (bool, np.bool_))
    assert isinstance(info, dict) and isinstance(info["action_is_valid"], (bool, np.bool_))
    vocabulary = env.action_vocabulary
    if vocabulary is not None and match_action(action, vocabulary) is None:
        # Not an action name: flagged invalid, nothing happened, no reward.
        assert not info["action_is_valid"]
        assert observation == before and reward == 0.0 and not (terminated or truncated)
    if not info["action_is_valid"]:
        assert reward == 0.0 and observation == before


def test_fuzz_case_count_is_reported(record_property, chat_template, tiny_tokenizer):
    """The total over every fuzz target, in any test order: targets not run yet run here."""
    counts = {
        "answer_parser": _fuzzed("answer_parser", _fuzz_answer_parser),
        "prompt_protocol": _fuzzed("prompt_protocol", lambda: _fuzz_prompt_protocol(chat_template, tiny_tokenizer)),
        **{f"env {name}": _fuzzed(f"env {name}", lambda name=name: _fuzz_env(name)) for name in ENVS},
    }
    total = sum(counts.values())
    record_property("fuzz_cases_total", total)
    print(f"fuzz total: {total} cases ({', '.join(f'{k}={v}' for k, v in counts.items())})")
    assert total == EXPECTED_TOTAL
