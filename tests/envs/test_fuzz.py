"""Fuzz tests: arbitrary model output at the answer parser and the prompt
protocol, arbitrary action strings at every registered env, arbitrary
`--set KEY=VALUE` text (env configs among them) at the config's checks.

Nothing may raise: the parser always returns a `ParsedAnswer` whose fields
are consistent with the text, every env step returns a well-formed 5-tuple
with a finite reward, flagging actions it did not understand, and a setting
is either taken or refused with a ValueError/TypeError naming it. Each case
is bounded by `CASE_TIMEOUT_S`: one that runs longer fails as a hang.

Each test records how many cases it ran (`record_property("fuzz_cases", n)`,
in JUnit XML) and prints it; `pytest -rA tests/envs/test_fuzz.py` shows the
counts and the total in the normal output. Each fuzz target runs once per
session and case count, by whichever test asks first: the total does not
depend on which tests ran before it, or on whether they were selected at all.
The fast tier runs `FAST` cases per target; the slow tier's
`test_fuzz_at_scale` runs `SLOW` (10,000 or more in all) and prints the total
with its crashes and hangs.
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from run_helpers import tiny_config

from envs import list_envs, make_env
from envs.base import match_action
from rllib_ragen.algorithm.settings_groups import settings_of
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.rollout.prompt.prompt_protocol import (
    ACTION_SEPARATOR,
    ParsedAnswer,
    PromptProtocol,
    ProtocolSettings,
    parse_answer,
)
from rllib_ragen.run.settings_flag import apply_setting

# Cases per fuzz target (env: per env; each env case is a reset and up to 8 steps).
FAST = {"answer_parser": 400, "prompt_protocol": 100, "env": 200, "set": 100}
SLOW = {"answer_parser": 3500, "prompt_protocol": 500, "env": 300, "set": 3200}  # 10,200 with 10 envs
CASE_TIMEOUT_S = 10.0  # far above any case's time: a case still running then hangs
ENVS = list_envs()  # at collection: the built-in envs (tests register others at run time)


def _total(cases: dict[str, int]) -> int:
    return cases["answer_parser"] + cases["prompt_protocol"] + cases["env"] * len(ENVS) + cases["set"]


class FuzzHang(Exception):
    """A fuzz case still running after `CASE_TIMEOUT_S`."""


@contextlib.contextmanager
def _bounded(what: str) -> Iterator[None]:
    """Within: a FuzzHang naming `what` once CASE_TIMEOUT_S seconds pass (SIGALRM; pytest runs tests on the main thread)."""

    def hang(signum, frame):
        raise FuzzHang(f"{what} ran past {CASE_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

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

# Cases run per (fuzz target, cases asked), filled by `_fuzzed` (a target that raised is not in it).
_cases: dict[tuple[str, int], int] = {}


def _fuzzed(name: str, fuzz, cases: int) -> int:
    """The number of cases `fuzz(cases)` ran for target `name`: run on the first request, then recalled."""
    if (name, cases) not in _cases:
        _cases[name, cases] = fuzz(cases)
    return _cases[name, cases]


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


def _fuzz_answer_parser(cases: int) -> int:
    count = 0

    @settings(FUZZ, max_examples=cases)
    @given(
        text=model_text,
        max_actions=st.integers(1, 6),
        vocabulary=st.sampled_from([None, ("Up", "Down", "Left", "Right"), ("Dragon", "Phoenix")]),
        think=st.booleans(),
    )
    def check(text, max_actions, vocabulary, think):
        nonlocal count
        count += 1
        with _bounded(f"parse_answer({text!r})"):
            parsed = parse_answer(text, max_actions_per_turn=max_actions, action_vocabulary=vocabulary, think=think)
        _check_parsed(parsed, text, max_actions=max_actions, vocabulary=vocabulary, think=think)

    check()
    return count


def test_answer_parser_survives_arbitrary_text(record_property):
    cases = FAST["answer_parser"]
    _report(record_property, "answer_parser", _fuzzed("answer_parser", _fuzz_answer_parser, cases), cases)


def _fuzz_prompt_protocol(chat_template, tiny_tokenizer, cases: int) -> int:
    """Sampled token ids (any id of the vocabulary, specials included) decode and parse."""
    count = 0
    vocab_size = len(tiny_tokenizer)

    @settings(FUZZ, max_examples=cases)
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
        with _bounded(f"the protocol on {response_ids}"):
            decoded, parsed = protocol.parse(response_ids)
            closed = protocol.close_ids(response_ids)
        assert isinstance(decoded, str)
        _check_parsed(parsed, decoded, max_actions=2, vocabulary=("Up", "Down"), think=think)
        assert isinstance(closed, list)

    check()
    return count


def test_prompt_protocol_parses_arbitrary_token_ids(record_property, chat_template, tiny_tokenizer):
    cases = FAST["prompt_protocol"]
    count = _fuzzed("prompt_protocol", lambda n: _fuzz_prompt_protocol(chat_template, tiny_tokenizer, n), cases)
    _report(record_property, "prompt_protocol", count, cases)


def _fuzz_env(env_name: str, cases: int) -> int:
    count = 0
    env = make_env(env_name)
    action = st.one_of(st.text(max_size=60), st.sampled_from(FRAGMENTS), model_text)

    @settings(FUZZ, max_examples=cases)
    @given(seed=st.integers(0, 2**31 - 1), actions=st.lists(action, min_size=1, max_size=8))
    def check(seed, actions):
        nonlocal count
        count += 1
        with _bounded(f"{env_name} from seed {seed}, actions {actions}"):
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
    cases = FAST["env"]
    count = _fuzzed(f"env {env_name}", lambda n: _fuzz_env(env_name, n), cases)
    _report(record_property, f"env {env_name}", count, cases)


_LITERAL = st.one_of(
    st.integers(), st.integers(-3, 12), st.floats(), st.booleans(), st.none(), st.text(max_size=8),
    st.lists(st.integers(-2, 9), max_size=4),
)  # fmt: skip
# What a user may type after `--set KEY=`: any text, or the repr of a literal, a tuple or a dict (an env config).
SETTING_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(FRAGMENTS),
    _LITERAL.map(repr),
    st.lists(_LITERAL, max_size=3).map(lambda items: repr(tuple(items))),
    st.dictionaries(st.sampled_from(["size", "dim_room", "num_boxes", "max_steps", "distance", "p"]), _LITERAL,
                    max_size=3).map(repr),
)  # fmt: skip
SETTING_KEYS = sorted(settings_of(StarPOConfig()).keys() | {"env", "env_config", "no_such_key"})


def _fuzz_settings(model_path, cases: int) -> int:
    """`--set KEY=TEXT` then the config's checks: the setting is taken, or refused by a ValueError/TypeError."""
    count = 0
    base = tiny_config(model_path)

    @settings(FUZZ, max_examples=cases)
    @given(key=st.sampled_from(SETTING_KEYS), text=SETTING_TEXT)
    def check(key, text):
        nonlocal count
        count += 1
        config = base.copy(copy_frozen=False)
        with _bounded(f"--set {key}={text}"), contextlib.suppress(ValueError, TypeError):
            apply_setting(config, f"{key}={text}")
            config.validate_starpo()

    check()
    return count


def test_a_dict_setting_of_rllib_refuses_none(tiny_model_path):
    """Found by the slow tier's fuzzing: `--set env_config=None` once reached RLlib's dict merge and crashed
    there with an AttributeError; a dict setting takes a dict only."""
    config = tiny_config(tiny_model_path)
    with pytest.raises(ValueError, match="env_config takes dict"):
        apply_setting(config, "env_config=None")
    apply_setting(config, "env_config={'distance': 2}")
    assert config.env_config["distance"] == 2


def test_set_values_are_taken_or_refused_by_name(record_property, tiny_model_path):
    cases = FAST["set"]
    _report(record_property, "set", _fuzzed("set", lambda n: _fuzz_settings(tiny_model_path, n), cases), cases)


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


def _all_counts(cases: dict[str, int], chat_template, tiny_tokenizer, model_path) -> dict[str, int]:
    """Cases run per fuzz target at `cases` (targets not run yet at that size run here)."""
    return {
        "answer_parser": _fuzzed("answer_parser", _fuzz_answer_parser, cases["answer_parser"]),
        "prompt_protocol": _fuzzed(
            "prompt_protocol", lambda n: _fuzz_prompt_protocol(chat_template, tiny_tokenizer, n),
            cases["prompt_protocol"],
        ),
        **{f"env {name}": _fuzzed(f"env {name}", lambda n, name=name: _fuzz_env(name, n), cases["env"])
           for name in ENVS},
        "set": _fuzzed("set", lambda n: _fuzz_settings(model_path, n), cases["set"]),
    }  # fmt: skip


def _report_total(record_property, counts: dict[str, int], expected: int) -> None:
    """Prints the total; a crash or a hang would have failed the target that met it, so both are 0 here."""
    total = sum(counts.values())
    record_property("fuzz_cases_total", total)
    print(f"fuzz total: {total} cases, 0 crashes, 0 hangs ({', '.join(f'{k}={v}' for k, v in counts.items())})")
    assert total == expected


def test_fuzz_case_count_is_reported(record_property, chat_template, tiny_tokenizer, tiny_model_path):
    """The total over every fuzz target, in any test order."""
    _report_total(record_property, _all_counts(FAST, chat_template, tiny_tokenizer, tiny_model_path), _total(FAST))


@pytest.mark.slow
def test_fuzz_at_scale(record_property, chat_template, tiny_tokenizer, tiny_model_path):
    """Every target at the slow tier's counts: 10,000 cases or more, each bounded by CASE_TIMEOUT_S."""
    assert _total(SLOW) >= 10_000
    _report_total(record_property, _all_counts(SLOW, chat_template, tiny_tokenizer, tiny_model_path), _total(SLOW))


# Env configs that `check_env_config` once passed but the env then crashed on (found by fuzzing env configs
# straight into `check_env_config` and `make_env`): now each is refused by its check.
_CRASHING_ENV_CONFIGS = [
    ("corridor", {"distance": 25044910519491}),  # MemoryError building the corridor
    ("corridor", {"distance": 6.7e165}),  # TypeError: a float distance
    ("countdown", {"max_number": 25044910519491}),  # RuntimeError: no instance in 1000 tries
    ("countdown", {"max_number": 6.7e165}),  # ValueError at reset: high is out of bounds for int64
]


@pytest.mark.parametrize(("env_name", "config"), _CRASHING_ENV_CONFIGS, ids=lambda v: str(v))
def test_an_env_config_is_refused_by_its_check_or_builds_an_env_that_resets(env_name, config):
    from envs import check_env_config

    try:
        check_env_config(env_name, config)
    except ValueError:
        return
    with _bounded(f"{env_name} with {config}"):
        env = make_env(env_name, **config)
        observation, _ = env.reset(seed=0)
    assert isinstance(observation, str)
