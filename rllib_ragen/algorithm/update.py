"""Step 4 of an iteration: advantages and the learners' update on the kept groups.

`learner_group.update` runs the learner connector on each learner (token rows ->
old log-probs and values -> advantages, `rllib_ragen.training.learner_connector`
and `rllib_ragen.training.advantages.advantage_estimation`), then `rollout_frequency`
passes of the loss over mini-batches (`rllib_ragen.training.learner`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from rllib_ragen.training.distributed import count_training_rows, learner_minibatch_sizes, shard_groups
from rllib_ragen.training.learner import UpdateSettings

if TYPE_CHECKING:
    from rllib_ragen.training.learner import StarPOTorchLearner


def update_learners(
    learner_group: LearnerGroup,
    kept: list[MultiAgentEpisode],
    settings: UpdateSettings,
    *,
    history_window: int | None,
    iteration: int,
) -> list[dict]:
    """One `rollout_frequency`-epoch update on the kept groups; returns the learners' results.

    With num_learners >= 2 each learner trains on whole groups (RLlib's own
    sharding would slice group episodes) with the same number of optimiser
    steps, each covering its share of the global mini-batch.

    Args:
        learner_group: The algorithm's `LearnerGroup`.
        kept: The group episodes the filter kept.
        settings: How the rows are cut into optimiser steps (`.training()`).
        history_window: The prompts' history window (a row is one turn when it is set).
        iteration: The iteration this update belongs to, from 1 (RLlib's sampled-steps counter for the learners).
    """
    common = dict(
        timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: iteration},
        num_epochs=settings.rollout_frequency,
        shuffle_batch_per_epoch=True,
    )
    num_learners = len(learner_group)
    step_rows = settings.rows_per_step(count_training_rows(kept, history_window=history_window))
    if num_learners < 2:
        return learner_group.update(episodes=kept, minibatch_size=step_rows, **common)
    shards = shard_groups(kept, num_learners)
    rows = [count_training_rows(shard, history_window=history_window) for shard in shards]
    sizes, steps = learner_minibatch_sizes(rows, step_rows, settings.rollout_frequency)
    results = learner_group.foreach_learner(
        _update_on_own_shard,
        shards=[ray.put(shard) for shard in shards],
        minibatch_sizes=sizes,
        num_total_minibatches=steps,
        **common,
    )
    out = []
    for result in results:
        if not result.ok:
            raise result.get()
        out.append(result.get())
    return out


def _update_on_own_shard(
    learner: StarPOTorchLearner, *, shards: list[ray.ObjectRef], minibatch_sizes: list[int], **update_kwargs: Any
) -> dict:
    """Runs on every learner of a DDP group: updates on the shard of its torch.distributed rank."""
    rank = torch.distributed.get_rank()
    return learner.update(episodes=ray.get(shards[rank]), minibatch_size=minibatch_sizes[rank], **update_kwargs)
