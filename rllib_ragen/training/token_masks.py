"""Selective token masks (VAGEN's TRICO): which generated tokens train the policy, which carry advantages.

Two masks are chosen by name, each from the registry :data:`TOKEN_MASKS`:

- ``M_loss`` (`.training(loss_token_mask=...)`): the generated tokens whose
  policy-gradient, entropy and KL terms enter the loss;
- ``M_adv`` (`.training(advantage_token_mask=...)`): the generated tokens that get
  values and advantages; GAE runs over them only, credit passing over the
  others (see `rllib_ragen.training.advantages.restrict_to_advantage_mask`).

The learner carries M_loss as `Columns.LOSS_MASK` and M_adv as `ADVANTAGE_MASK`
(`rllib_ragen.columns`), the generated tokens as `GENERATED_MASK`.

A policy is a pure function of a :class:`TokenSpans` (trajectory layout
[B, T], see `rllib_ragen.training.advantages`) returning a [B, T] bool mask. The spans
are the protocol's (`rllib_ragen.rollout.prompt.prompt_protocol.response_token_spans`):
the `<think>` block, the `<answer>` block, and the rest (template tokens such
as the end-of-turn token, whitespace between blocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from rllib_ragen.logits import to_bool_mask
from rllib_ragen.rollout.prompt.prompt_protocol import (
    SPAN_ANSWER,
    SPAN_THINK,
    ProtocolSettings,
    response_token_spans,
)
from rllib_ragen.user_registries import add_to_registry

Tensor = torch.Tensor
TokenMaskPolicy = Callable[["TokenSpans"], Tensor]

# The policy that keeps every generated token: the default of both masks (StarPO as before).
ALL_TOKENS = "all"


@dataclasses.dataclass(frozen=True)
class TokenSpans:
    """What a mask policy may select by.

    Attributes:
        generated_mask: [B, T] bool, the generated tokens.
        turn_ends: [B, T] bool, the last generated token of each turn.
        labels: [B, T] int, each token's `SPAN_*` (0 off the generated tokens); None when
            no policy needs them (both masks "all").
    """

    generated_mask: Tensor
    turn_ends: Tensor
    labels: Tensor | None = None

    def require_labels(self, policy: str) -> Tensor:
        """The span labels, or a clear error naming the policy that needs them."""
        if self.labels is None:
            raise ValueError(f"token mask policy {policy!r} needs span labels, but TokenSpans.labels is None")
        return self.labels


def _all_tokens(spans: TokenSpans) -> Tensor:
    return spans.generated_mask


def _think_and_answer(spans: TokenSpans) -> Tensor:
    labels = spans.require_labels("think_and_answer")
    return (labels == SPAN_THINK) | (labels == SPAN_ANSWER)


def _answer_only(spans: TokenSpans) -> Tensor:
    return spans.require_labels("answer_only") == SPAN_ANSWER


TOKEN_MASKS: dict[str, TokenMaskPolicy] = {
    ALL_TOKENS: _all_tokens,
    "think_and_answer": _think_and_answer,
    "answer_only": _answer_only,
}


def register_token_mask(name: str, policy: TokenMaskPolicy, *, overwrite: bool = False) -> None:
    """Adds a mask policy ``fn(spans: TokenSpans) -> [B, T] bool``.

    The result is intersected with the generated tokens. The registry is per
    process: register in a module every learner process imports.

    Args:
        name: The name `.training(loss_token_mask=..., advantage_token_mask=...)` selects it by.
        policy: The function.
        overwrite: Replace a policy of the same name.
    """
    add_to_registry(TOKEN_MASKS, "token mask policy", name, policy, overwrite=overwrite)


def unregister_token_mask(name: str) -> None:
    """Removes a registered policy (e.g. a test's)."""
    get_token_mask(name)
    TOKEN_MASKS.pop(name)


def get_token_mask(name: str) -> TokenMaskPolicy:
    """Returns the policy registered as ``name``."""
    try:
        return TOKEN_MASKS[name]
    except KeyError:
        raise KeyError(f"unknown token mask policy {name!r}; choose one of {sorted(TOKEN_MASKS)}") from None


def build_token_mask(name: str, spans: TokenSpans) -> Tensor:
    """Runs policy ``name``: the [B, T] bool mask of the generated tokens it selects."""
    generated_mask = spans.generated_mask
    chosen = to_bool_mask(get_token_mask(name)(spans), shape=generated_mask.shape, name=f"token mask {name!r}")
    return chosen & generated_mask


class ResponseSpanLabeller:
    """Labels generated tokens with their protocol span, from token ids alone (no re-tokenising).

    Args:
        tokenizer: The policy's tokenizer (decodes one id at a time; each id's text is cached).
        protocol: The protocol the responses were sampled with (think mode, prefill).
    """

    def __init__(self, tokenizer: Any, protocol: ProtocolSettings) -> None:
        self.tokenizer = tokenizer
        self.protocol = protocol
        self._texts: dict[int, str] = {}

    def __call__(self, token_ids: Tensor, generated_mask: Tensor, turn_ends: Tensor) -> TokenSpans:
        """Spans of trajectory-layout tokens.

        Args:
            token_ids: [B, T] generated token ids, all turns of a trajectory in order.
            generated_mask: [B, T] bool, the generated tokens.
            turn_ends: [B, T] bool, the last token of each turn.
        """
        labels = torch.zeros(token_ids.shape, dtype=torch.long)
        for b in range(token_ids.shape[0]):
            ends = turn_ends[b].nonzero().squeeze(1).tolist()
            for start, end in zip([0] + [e + 1 for e in ends[:-1]], ends):
                texts = [self._text(int(i)) for i in token_ids[b, start : end + 1]]
                labels[b, start : end + 1] = torch.tensor(response_token_spans(texts, config=self.protocol))
        return TokenSpans(generated_mask=generated_mask, turn_ends=turn_ends, labels=labels)

    def _text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=True)
        return self._texts[token_id]
