"""`GroupSampler`: what `StarPO.training_step` draws one iteration's group episodes from."""

from __future__ import annotations

from typing import Any, Protocol

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode


class GroupSampler(Protocol):
    """One iteration's groups, one `MultiAgentEpisode` per group, from rollouts or a dataset.

    A sampler logs its own metrics (`env_runners/`, `async_rollouts/`, `offline_data/`) into
    the algorithm's `MetricsLogger`, and its state (the training-seed cursor) is part of the
    algorithm's checkpoint.
    """

    def sample(self, *, iteration: int) -> list[MultiAgentEpisode]:
        """The groups of iteration `iteration` (1-based)."""
        ...

    def drain(self) -> None:
        """Waits for rollouts still running with the current weights, before they are replaced."""
        ...

    def get_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the sampler (entries of the algorithm's own state)."""
        ...

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores what `get_state` returned (from the algorithm's whole state)."""
        ...

    def close(self) -> None:
        """Releases what the sampler holds."""
        ...
