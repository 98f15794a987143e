"""The prompt/answer protocol: env text -> prompt tokens, sampled tokens -> actions.

Pure and RLlib-free. One `PromptProtocol` per (tokenizer, env) pair renders
the system prompt from the env's instructions, renders each turn's user
message (reward, feedback, state, remaining budget) as tokens to append, and
decodes and parses the model's sampled tokens into actions: an answer
`<think>...</think><answer>a1 || a2</answer>` (`parse_answer`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from rllib_ragen.rollout.prompt.token_history import ChatTemplate, check_history_window

ACTION_SEPARATOR = "||"

_THINK_ANSWER = re.compile(
    r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>(?P<rest>.*)$",
    re.DOTALL,
)
_ANSWER_ONLY = re.compile(r"^\s*<answer>(?P<answer>.*?)</answer>(?P<rest>.*)$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ParsedAnswer:
    """What a model answer asks the environment to do.

    Attributes:
        actions: Valid actions to execute, in order, at most `max_actions_per_turn`.
        think: The reasoning text, or None in no-think mode or when malformed.
        invalid_actions: Actions within the budget that the env does not know.
        dropped_actions: Actions beyond `max_actions_per_turn` (never executed).
        format_ok: The answer had the required tags.
        error: Why the answer gave no valid action, or None.
    """

    actions: tuple[str, ...]
    think: str | None = None
    invalid_actions: tuple[str, ...] = ()
    dropped_actions: tuple[str, ...] = ()
    format_ok: bool = True
    error: str | None = None

    @property
    def has_valid_action(self) -> bool:
        return bool(self.actions)


def parse_answer(
    text: str,
    *,
    max_actions_per_turn: int,
    action_vocabulary: Sequence[str] | None = None,
    think: bool = True,
) -> ParsedAnswer:
    """Extracts the actions of one model turn.

    Only the first `<answer>` block counts; text after it is ignored (models
    often append a stray end-of-turn marker). Actions are split on `||`,
    the first `max_actions_per_turn` are kept, and with a vocabulary each is
    matched case-insensitively to its canonical spelling.

    Args:
        text: The decoded model turn, including any prefilled tags.
        max_actions_per_turn: Most actions executed from one answer.
        action_vocabulary: The env's action names, or None for free-form actions.
        think: Whether a `<think>` block is required before the answer.
    """
    if max_actions_per_turn < 1:
        raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
    match = (_THINK_ANSWER if think else _ANSWER_ONLY).match(text)
    if match is None:
        expected = "<think>...</think><answer>...</answer>" if think else "<answer>...</answer>"
        return ParsedAnswer(actions=(), format_ok=False, error=f"malformed answer: expected {expected}")
    proposed = [a.strip() for a in match["answer"].split(ACTION_SEPARATOR)]
    proposed = [a for a in proposed if a]
    kept, dropped = proposed[:max_actions_per_turn], proposed[max_actions_per_turn:]
    valid, invalid = _match_vocabulary(kept, action_vocabulary)
    error = None
    if not valid:
        error = "empty answer" if not kept else f"no valid action in {kept!r}"
    return ParsedAnswer(
        actions=tuple(valid),
        think=match["think"].strip() if think else None,
        invalid_actions=tuple(invalid),
        dropped_actions=tuple(dropped),
        error=error,
    )


def answer_spans(text: str, *, think: bool = True) -> dict[str, tuple[int, int]]:
    """Character spans of the `<think>` and `<answer>` blocks, tags included.

    Uses the same matching as `parse_answer`, so a malformed answer (which
    `parse_answer` executes nothing from) has no spans at all.

    Args:
        text: The decoded model turn, including any prefilled tags.
        think: Whether a `<think>` block is required before the answer.

    Returns:
        {"think": (start, end), "answer": (start, end)} with end exclusive;
        no "think" key in no-think mode, an empty dict when malformed.
    """
    match = (_THINK_ANSWER if think else _ANSWER_ONLY).match(text)
    if match is None:
        return {}
    blocks = ("think", "answer") if think else ("answer",)
    return {name: (match.start(name) - len(f"<{name}>"), match.end(name) + len(f"</{name}>")) for name in blocks}


def _match_vocabulary(actions: Sequence[str], vocabulary: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Splits actions into (valid canonical names, unknown ones)."""
    if vocabulary is None:
        return list(actions), []
    canonical = {name.lower(): name for name in vocabulary}
    valid = [canonical[a.lower()] for a in actions if a.lower() in canonical]
    invalid = [a for a in actions if a.lower() not in canonical]
    return valid, invalid


@dataclasses.dataclass(frozen=True)
class ProtocolSettings:
    """How prompts are written and answers read (set with `StarPOConfig.rollouts()`).

    Each field is documented where `StarPOConfig.rollouts()` sets it.
    """

    max_actions_per_turn: int = 5
    think: bool = True
    prefill: bool = False
    history_window: int | None = None

    def __post_init__(self) -> None:
        if self.max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}")
        check_history_window(self.history_window)

    @property
    def prefill_text(self) -> str:
        if not self.prefill:
            return ""
        return "<think>" if self.think else "<answer>"


class PromptProtocol:
    """Renders prompts for one env and parses the model's answers.

    Args:
        template: The tokenizer's chat template pieces.
        instructions: The env's rules and legend (its `instructions`).
        action_vocabulary: The env's action names, or None for free-form actions.
        config: Prompt and parsing settings.
    """

    def __init__(
        self,
        template: ChatTemplate,
        *,
        instructions: str,
        action_vocabulary: Sequence[str] | None,
        config: ProtocolSettings,
    ) -> None:
        self.template = template
        self.config = config
        self.action_vocabulary = tuple(action_vocabulary) if action_vocabulary else None
        self.system_text = self._system_text(instructions)
        self.system_ids = template.system_ids(self.system_text)

    def _system_text(self, instructions: str) -> str:
        n = self.config.max_actions_per_turn
        example = _example_answer(self.action_vocabulary, n)
        if self.config.think:
            answer_format = f"<think>your short reasoning</think><answer>{example}</answer>"
        else:
            answer_format = f"<answer>{example}</answer>"
        return (
            f"{instructions.strip()}\n"
            f"You may take up to {n} action(s) per turn, separated by '{ACTION_SEPARATOR}'.\n"
            f"Always answer in the format {answer_format}"
        )

    def user_ids(
        self,
        observation: str,
        *,
        reward: float | None = None,
        feedback: str | None = None,
        turns_left: int | None = None,
        actions_left: int | None = None,
    ) -> list[int]:
        """Tokens of one user message plus the assistant header (and prefill)."""
        lines = []
        if reward is not None:
            lines.append(f"Reward: {reward:g}")
        if feedback:
            lines.append(feedback)
        lines.append(f"State:\n{observation}")
        budget = []
        if turns_left is not None:
            budget.append(f"{turns_left} turn(s)")
        if actions_left is not None:
            budget.append(f"{actions_left} action(s)")
        if budget:
            lines.append(f"You have {' and '.join(budget)} left.")
        return self.template.user_ids("\n".join(lines), prefill=self.config.prefill_text)

    def parse(self, response_ids: Sequence[int]) -> tuple[str, ParsedAnswer]:
        """Decodes a sampled response (with the prefill put back) and parses it."""
        text = self.config.prefill_text + self.template.tokenizer.decode(list(response_ids), skip_special_tokens=True)
        parsed = parse_answer(
            text,
            max_actions_per_turn=self.config.max_actions_per_turn,
            action_vocabulary=self.action_vocabulary,
            think=self.config.think,
        )
        return text, parsed

    def close_ids(self, response_ids: Sequence[int]) -> list[int]:
        return self.template.close_ids(list(response_ids))

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.template.eos_token_id,)


# What part of a response a generated token belongs to (see `response_token_spans`).
SPAN_OTHER = 0  # template and stray tokens: end-of-turn, whitespace between blocks, text after the answer
SPAN_THINK = 1  # `<think>...</think>`, tags included
SPAN_ANSWER = 2  # `<answer>...</answer>`, tags included


def response_token_spans(token_texts: Sequence[str], *, config: ProtocolSettings) -> list[int]:
    """The span (`SPAN_*`) of each token of one sampled response.

    The tokens' texts are joined (after the prefill, which has no tokens) and
    the blocks found as `parse_answer` finds them. A token belongs to the
    answer if any of its characters does (the tokens that decide the action),
    else to the thought if any of its characters does; a malformed response
    has only `SPAN_OTHER` tokens.

    Args:
        token_texts: Each generated token decoded on its own (special tokens as "").
        config: The protocol that sampled the response (think mode, prefill).

    Returns:
        One `SPAN_*` per token.
    """
    prefill = config.prefill_text
    spans = answer_spans(prefill + "".join(token_texts), think=config.think)
    labels, start = [], len(prefill)
    for text in token_texts:
        end = start + len(text)
        label = SPAN_OTHER
        for name, span_label in (("think", SPAN_THINK), ("answer", SPAN_ANSWER)):
            if name in spans and start < spans[name][1] and spans[name][0] < end:
                label = span_label
        labels.append(label)
        start = end
    return labels


def feedback_for(parsed: ParsedAnswer) -> str | None:
    """A short note shown in the next prompt when the answer was (partly) unusable."""
    if parsed.error:
        return f"Your last answer was not used: {parsed.error}."
    if parsed.invalid_actions:
        return f"Ignored invalid action(s): {', '.join(parsed.invalid_actions)}."
    return None


def _example_answer(vocabulary: Sequence[str] | None, max_actions: int) -> str:
    # With one action per turn the example would *be* a choice (the Bandit's
    # first arm, say), and small models copy it: a placeholder biases nothing.
    if not vocabulary or max_actions == 1:
        return "your action"
    return f" {ACTION_SEPARATOR} ".join(vocabulary[:2])
