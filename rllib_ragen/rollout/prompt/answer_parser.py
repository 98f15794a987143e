"""Parses a model answer `<think>...</think><answer>a1 || a2</answer>` into actions."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

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
