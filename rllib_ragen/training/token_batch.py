"""Episodes -> padded token rows, and the map between rows and trajectories.

The learner sees two layouts of the same generated tokens:
- rows   [R, L]: what the model is run on (one row per trajectory with the
  full history, one row per turn with a history window);
- trajectories [B, T]: each trajectory's generated tokens of all turns in
  order, where advantages are computed (see `rllib_ragen.training.advantages`).
`TokenBatch.to_trajectories` / `to_rows` move per-token values between them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import torch
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rllib_ragen.rollout.trajectory_record import Trajectory, trajectories_from_episodes

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
    """

    generated_mask: torch.Tensor
    turn_rewards: torch.Tensor
    turn_ends: torch.Tensor
    group_ids: torch.Tensor


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
    return TrajectoryLayout(generated_mask=mask, turn_rewards=rewards, turn_ends=ends, group_ids=group_ids)
