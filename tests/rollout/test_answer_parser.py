import pytest

from rllib_ragen.rollout.prompt.answer_parser import parse_answer

VOCAB = ("Up", "Down", "Left", "Right")


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
