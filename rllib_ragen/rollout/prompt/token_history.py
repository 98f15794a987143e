"""Token-level history of one trajectory: the exact ids the model saw and sampled.

Layout of a trajectory with turns 0..n-1:

    system | user_0 response_0 close_0 | user_1 response_1 close_1 | ... | user_t

`user_i` holds the rendered user message (state, reward) and the assistant
header (plus any answer prefill); `response_i` holds the sampled ids exactly as
the engine returned them; `close_i` ends the assistant message. The prompt of
turn t is the concatenation above (or only the last k turns of it), so a prompt
is always a concatenation of earlier token pieces: nothing is re-tokenised.

The learner's row layout follows from the history window (`one_row_per_turn`):
with the full history a trajectory is one row, with a window each turn saw its
own prompt and is its own row.

The pieces come from the tokenizer's chat template (`ChatTemplate`), split into
append-only token pieces: the system block, the text around a user message
(ending with the assistant header), and the text that closes an assistant
message. They are found once by rendering conversations with sentinel messages,
and checked against the template's own rendering of a two-turn conversation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

_SYSTEM = "\x00SYSTEM\x00"
_USER = ("\x00USER-A\x00", "\x00USER-B\x00")
_ASSISTANT = "\x00ASSISTANT\x00"


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """Token pieces of a chat template, found from the tokenizer.

    Attributes:
        user_prefix: Text before a user message's content.
        user_suffix: Text after it, through the assistant header of the reply.
        assistant_close: Text that ends an assistant message (e.g. "<|im_end|>\\n").
        eos_token_id: The id that ends a generated turn.
    """

    tokenizer: Any
    user_prefix: str
    user_suffix: str
    assistant_close: str
    eos_token_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat "
                "template; use an instruct model (e.g. smollm2-135m-instruct)"
            )
        render = _renderer(tokenizer)
        system = render([_msg("system", _SYSTEM)], generation_prompt=False)
        one_turn = render([_msg("system", _SYSTEM), _msg("user", _USER[0])], generation_prompt=True)
        user_block = _strip_prefix(one_turn, system, "system block")
        user_prefix, user_suffix = user_block.split(_USER[0])
        replied = render(
            [_msg("system", _SYSTEM), _msg("user", _USER[0]), _msg("assistant", _ASSISTANT)],
            generation_prompt=False,
        )
        assistant_close = _strip_prefix(replied, one_turn + _ASSISTANT, "assistant reply")
        template = cls(
            tokenizer=tokenizer,
            user_prefix=user_prefix,
            user_suffix=user_suffix,
            assistant_close=assistant_close,
            eos_token_id=_end_of_turn_id(tokenizer, assistant_close),
        )
        template._check_append_only(render)
        return template

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with special tokens parsed and no BOS added."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def system_ids(self, system_text: str) -> list[int]:
        """Tokens of the system block."""
        rendered = _renderer(self.tokenizer)([_msg("system", system_text)], generation_prompt=False)
        return self.encode(rendered)

    def user_ids(self, user_text: str, *, prefill: str = "") -> list[int]:
        """Tokens of a user message plus the assistant header (and an answer prefill)."""
        return self.encode(self.user_prefix + user_text + self.user_suffix + prefill)

    def close_ids(self, response_ids: list[int]) -> list[int]:
        """Tokens that close an assistant message the model generated.

        When the model stopped on its end-of-turn token, only the rest of the
        closing text is appended (for ChatML: the newline after `<|im_end|>`).
        """
        close = self.assistant_close
        eos_text = self.tokenizer.convert_ids_to_tokens(self.eos_token_id)
        if response_ids and response_ids[-1] == self.eos_token_id and close.startswith(eos_text):
            close = close[len(eos_text) :]
        return self.encode(close) if close else []

    def _check_append_only(self, render: Any) -> None:
        """Fails if appending pieces does not reproduce the template's own rendering."""
        conversation = [
            _msg("system", _SYSTEM),
            _msg("user", _USER[0]),
            _msg("assistant", _ASSISTANT),
            _msg("user", _USER[1]),
        ]
        expected = render(conversation, generation_prompt=True)
        system = render(conversation[:1], generation_prompt=False)
        composed = (
            system
            + self.user_prefix
            + _USER[0]
            + self.user_suffix
            + _ASSISTANT
            + self.assistant_close
            + self.user_prefix
            + _USER[1]
            + self.user_suffix
        )
        if composed != expected:
            raise ValueError(
                "the tokenizer's chat template is not append-only (it rewrites earlier turns), "
                "so multi-turn prompts cannot be built by appending tokens; use a ChatML-style "
                f"model. Expected {expected!r}, composed {composed!r}"
            )


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _renderer(tokenizer: Any) -> Callable[..., str]:
    def render(messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    return render


def _end_of_turn_id(tokenizer: Any, assistant_close: str) -> int:
    """The token that ends an assistant turn: the closing text's own special
    token when it is one (ChatML's `<|im_end|>`), else the tokenizer's EOS."""
    ids = tokenizer.encode(assistant_close.strip(), add_special_tokens=False)
    if len(ids) == 1 and ids[0] in tokenizer.all_special_ids:
        return ids[0]
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token and its chat template no end-of-turn token")
    return tokenizer.eos_token_id


def _strip_prefix(text: str, prefix: str, what: str) -> str:
    if not text.startswith(prefix):
        raise ValueError(
            f"cannot split the chat template: the {what} does not extend the shorter "
            f"conversation ({prefix!r} is not a prefix of {text!r})"
        )
    return text[len(prefix) :]


def check_history_window(history_window: int | None) -> None:
    """Raises unless `history_window` is None (the full history) or a number of past turns >= 0."""
    if history_window is not None and history_window < 0:
        raise ValueError(f"history_window must be >= 0 or None, got {history_window}")


def one_row_per_turn(history_window: int | None) -> bool:
    """Whether the learner trains a trajectory as one row per turn (a history window) or one row."""
    return history_window is not None


def rows_per_trajectory(num_turns: int, history_window: int | None) -> int:
    """Training rows of a trajectory with `num_turns` answered turns (`TokenHistory.training_rows`)."""
    return num_turns if one_row_per_turn(history_window) else 1


@dataclasses.dataclass
class TokenTurn:
    """One model turn: its prompt piece, the sampled reply and its outcome."""

    user_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    response_logprobs: list[float] = dataclasses.field(default_factory=list)
    close_ids: list[int] = dataclasses.field(default_factory=list)
    reward: float = 0.0

    @property
    def is_answered(self) -> bool:
        return bool(self.response_ids)


@dataclasses.dataclass
class TokenHistory:
    """The growing token sequence of one trajectory.

    Args:
        system_ids: Tokens of the system block (instructions), shared by every prompt.
        history_window: Turns of history kept in a prompt besides the current
            one; None keeps the full history.
    """

    system_ids: list[int]
    history_window: int | None = None
    turns: list[TokenTurn] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check_history_window(self.history_window)

    def add_user(self, user_ids: list[int]) -> None:
        """Starts a new turn with the user message the model must answer."""
        if self.turns and not self.turns[-1].is_answered:
            raise RuntimeError("the previous turn has no response yet")
        self.turns.append(TokenTurn(user_ids=list(user_ids)))

    def add_response(self, response_ids: list[int], logprobs: list[float], close_ids: list[int]) -> None:
        """Records the sampled reply of the current turn and its closing tokens."""
        if not self.turns or self.turns[-1].is_answered:
            raise RuntimeError("add_user must come before add_response")
        if len(response_ids) != len(logprobs):
            raise ValueError(f"{len(response_ids)} response tokens but {len(logprobs)} log-probs")
        if not response_ids:
            raise ValueError("a response must hold at least one token")
        turn = self.turns[-1]
        turn.response_ids, turn.response_logprobs = list(response_ids), list(logprobs)
        turn.close_ids = list(close_ids)

    def prompt_ids(self, turn_index: int | None = None) -> list[int]:
        """Prompt of turn `turn_index` (default: the current one), within the history window."""
        if turn_index is None:
            if not self.turns or self.turns[-1].is_answered:
                raise RuntimeError("no unanswered turn: call add_user first")
            turn_index = len(self.turns) - 1
        first = 0 if self.history_window is None else max(0, turn_index - self.history_window)
        ids = list(self.system_ids)
        for turn in self.turns[first:turn_index]:
            ids += turn.user_ids + turn.response_ids + turn.close_ids
        return ids + self.turns[turn_index].user_ids

    def answered_turns(self) -> list[TokenTurn]:
        return [t for t in self.turns if t.is_answered]

    def full_sequence(self) -> tuple[list[int], list[int], list[float]]:
        """All answered turns as one sequence: (token ids, generated mask, sampling log-probs).

        The generated mask is 1 exactly on sampled response tokens; log-probs are 0
        elsewhere. The unanswered trailing user message is not included.
        """
        ids, mask, logprobs = list(self.system_ids), [0] * len(self.system_ids), [0.0] * len(self.system_ids)
        for turn in self.answered_turns():
            for piece, is_response, piece_logprobs in (
                (turn.user_ids, False, None),
                (turn.response_ids, True, turn.response_logprobs),
                (turn.close_ids, False, None),
            ):
                ids += piece
                mask += [int(is_response)] * len(piece)
                logprobs += list(piece_logprobs) if piece_logprobs is not None else [0.0] * len(piece)
        return ids, mask, logprobs

    def training_rows(self) -> list[tuple[list[int], list[int], list[float]]]:
        """Sequences the learner trains on: (token ids, generated mask, sampling log-probs).

        With the full history, one row holds the whole trajectory (each
        response is trained in the context it was sampled in). With a history
        window, turns saw different prompts, so each turn is its own row.
        Responses appear in turn order either way.
        """
        if not one_row_per_turn(self.history_window):
            return [self.full_sequence()]
        rows = []
        for index, turn in enumerate(self.answered_turns()):
            prompt = self.prompt_ids(index)
            rows.append(
                (
                    prompt + turn.response_ids,
                    [0] * len(prompt) + [1] * len(turn.response_ids),
                    [0.0] * len(prompt) + list(turn.response_logprobs),
                )
            )
        return rows
