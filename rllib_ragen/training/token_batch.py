"""Episodes -> padded token rows, and the map between rows and trajectories.

The learner sees two layouts of the same generated tokens:
- rows   [R, L]: what the model is run on (one row per trajectory with the
  full history, one row per turn with a history window);
- trajectories [B, T]: each trajectory's generated tokens of all turns in
  order, where advantages are computed (see `rllib_ragen.training.advantages`).
`TokenBatch.to_trajectories` / `to_rows` move per-token values between them.

Which generated tokens train the policy (M_loss) and which carry advantages (M_adv) is chosen by
name from the registry `TOKEN_MASKS` (VAGEN's TRICO selective token masks, `build_token_mask`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_ragen.logits import to_bool_mask
from rllib_ragen.rollout.prompt.prompt_protocol import (
    SPAN_ANSWER,
    SPAN_THINK,
    ProtocolSettings,
    response_token_spans,
)
from rllib_ragen.rollout.trajectory_record import Trajectory, trajectories_from_episodes
from rllib_ragen.user_registries import add_to_registry

# Padding is masked out by the attention mask, so any id in the vocabulary does.
PAD_TOKEN_ID = 0


@dataclasses.dataclass(frozen=True)
class TrajectoryLayout:
    """The trajectory layout [B, T]: each trajectory's generated tokens of all turns, in order.

    Attributes:
        generated_mask: [B, T] True on generated tokens (False on padding).
        turn_rewards: [B, T] each turn's reward on its last generated token.
        turn_ends: [B, T] True on the last generated token of each turn.
        group_ids: [B].
        roles: [B] each trajectory's role key in a two-player game (RAE's); None unless every one has one.
    """

    generated_mask: torch.Tensor
    turn_rewards: torch.Tensor
    turn_ends: torch.Tensor
    group_ids: torch.Tensor
    roles: tuple[str, ...] | None = None


@dataclasses.dataclass
class TokenBatch:
    """Padded rows [R, L] plus the index map to the trajectory layout.

    Attributes:
        input_ids, attention_mask, generated_mask: [R, L].
        sampling_logp: [R, L] log-probs the engine reported (0 off the generated tokens).
        row_of, col_of: [N] row and column of every generated token.
        traj_of, pos_of: [N] trajectory index and position in its trajectory.
        trajectories: The same generated tokens in the trajectory layout [B, T].
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    generated_mask: torch.Tensor
    sampling_logp: torch.Tensor
    row_of: torch.Tensor
    col_of: torch.Tensor
    traj_of: torch.Tensor
    pos_of: torch.Tensor
    trajectories: TrajectoryLayout

    def to_trajectories(self, row_values: torch.Tensor) -> torch.Tensor:
        """[R, L] per-token values -> [B, T] (0 off the generated tokens)."""
        out = torch.zeros(self.trajectories.generated_mask.shape, dtype=row_values.dtype)
        out[self.traj_of, self.pos_of] = row_values[self.row_of, self.col_of]
        return out

    def to_rows(self, traj_values: torch.Tensor) -> torch.Tensor:
        """[B, T] per-token values -> [R, L] (0 off the generated tokens)."""
        out = torch.zeros(self.generated_mask.shape, dtype=traj_values.dtype)
        out[self.row_of, self.col_of] = traj_values[self.traj_of, self.pos_of]
        return out


def token_batch_of_episodes(
    episodes: Iterable[MultiAgentEpisode | SingleAgentEpisode], *, history_window: int | None
) -> TokenBatch:
    """The padded token rows of every trajectory of `episodes` (the learner's first step)."""
    return build_token_batch(
        trajectories_from_episodes(episodes, history_window=history_window), pad_token_id=PAD_TOKEN_ID
    )


def build_token_batch(trajectories: Sequence[Trajectory], *, pad_token_id: int) -> TokenBatch:
    """Pads every trajectory's training rows and records where each generated token sits."""
    if not trajectories:
        raise ValueError("cannot build a token batch from zero trajectories")
    rows, row_traj = [], []
    for b, trajectory in enumerate(trajectories):
        for row in trajectory.history.training_rows():
            rows.append(row)
            row_traj.append(b)
    length = max(len(ids) for ids, _, _ in rows)
    n_rows = len(rows)
    input_ids = torch.full((n_rows, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n_rows, length), dtype=torch.long)
    generated_mask = torch.zeros((n_rows, length), dtype=torch.long)
    sampling_logp = torch.zeros((n_rows, length), dtype=torch.float32)
    for r, (ids, mask, logp) in enumerate(rows):
        n = len(ids)
        input_ids[r, :n] = torch.tensor(ids)
        attention_mask[r, :n] = 1
        generated_mask[r, :n] = torch.tensor(mask)
        sampling_logp[r, :n] = torch.tensor(logp)
    if generated_mask[:, 0].any():
        raise ValueError("a row starts with a generated token; it has no context to score it with")
    row_of, col_of = generated_mask.nonzero(as_tuple=True)
    traj_of = torch.tensor(row_traj)[row_of]
    pos_of = _running_position(traj_of)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generated_mask=generated_mask,
        sampling_logp=sampling_logp,
        row_of=row_of,
        col_of=col_of,
        traj_of=traj_of,
        pos_of=pos_of,
        trajectories=_trajectory_layout(trajectories),
    )


def _running_position(traj_of: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its trajectory, [N].

    Rows of one trajectory are consecutive and in turn order, so `traj_of` is
    sorted and the position is the distance to the trajectory's first token.
    """
    _, counts = torch.unique_consecutive(traj_of, return_counts=True)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return torch.arange(len(traj_of)) - starts


def _trajectory_layout(trajectories: Sequence[Trajectory]) -> TrajectoryLayout:
    lengths = [[len(t.response_ids) for t in traj.history.answered_turns()] for traj in trajectories]
    width = max(sum(turns) for turns in lengths)
    shape = (len(trajectories), width)
    rewards, ends, mask = torch.zeros(shape), torch.zeros(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool)
    for b, (trajectory, turn_lengths) in enumerate(zip(trajectories, lengths)):
        if len(turn_lengths) != len(trajectory.turn_rewards):
            raise ValueError(
                f"trajectory {b} has {len(turn_lengths)} answered turns but {len(trajectory.turn_rewards)} rewards"
            )
        end = 0
        for n, reward in zip(turn_lengths, trajectory.turn_rewards):
            end += n
            rewards[b, end - 1] = reward
            ends[b, end - 1] = True
        mask[b, :end] = True
    group_ids = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)
    roles = tuple(t.role for t in trajectories if t.role is not None)
    return TrajectoryLayout(
        generated_mask=mask,
        turn_rewards=rewards,
        turn_ends=ends,
        group_ids=group_ids,
        roles=roles if len(roles) == len(trajectories) else None,
    )


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
