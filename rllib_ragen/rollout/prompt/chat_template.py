"""Splits a tokenizer's chat template into append-only token pieces.

Multi-turn prompts are built by appending token ids, never by re-tokenising
text the model generated. For that we need the template's pieces on their own:
the system block, the text around a user message (ending with the assistant
header), and the text that closes an assistant message. They are found once by
rendering conversations with sentinel messages, and checked against the
template's own rendering of a two-turn conversation.
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
