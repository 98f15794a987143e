"""Reasoning-aware reward shaping: terms that keep the `<think>` part alive (RAGEN's finding 6).

Without rewards that look at the reasoning, thoughts get shorter and stop
explaining the action. Each term below is off by default (coefficient 0):

- ``think_length``: 1 when the turn's thought has between ``think_min_words``
  and ``think_max_words`` words, else 0 (also 0 without a well-formed thought);
- ``think_names_action``: the share of the turn's valid actions whose name the
  thought mentions (whole words, case-insensitive), 0 without a thought;
- ``advantage_length_weight`` (``alpha``): every token advantage of trajectory
  ``i`` is divided by ``(L_i / mean L) ** alpha``, ``L`` the trajectory's
  generated tokens (RAGEN-2's ``grpo_advantage_length_weight`` is ``alpha = 1``
  after GRPO), so a long trajectory's many tokens do not outweigh a short one's
  (applied with the advantages, `rllib_ragen.training.advantages.advantage_estimation`).

A turn's reward is ``task reward + sum(coeff * term)``. The turn's info keeps
the task reward (:data:`TASK_REWARD`), each term and the bonus, and
:func:`shaping_statistics` averages them for the rollout metrics, so the task
reward stays visible beside the shaped one.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

from rllib_ragen.rollout.prompt.prompt_protocol import ParsedAnswer

TASK_REWARD = "task_reward"
THINK_WORDS = "think_words"
THINK_LENGTH = "think_length"
THINK_NAMES_ACTION = "think_names_action"
SHAPING_BONUS = "shaping_bonus"
# Per-turn info entries averaged into rollout metrics (`<key>_mean`).
TURN_METRICS = (TASK_REWARD, THINK_WORDS, THINK_LENGTH, THINK_NAMES_ACTION, SHAPING_BONUS)


@dataclasses.dataclass(frozen=True)
class RewardShapingSettings:
    """Coefficients of the shaping terms (see the module docstring); 0 turns a term off.

    Each field is documented where `StarPOConfig.reward_shaping()` sets it.
    """

    think_length_coeff: float = 0.0
    think_min_words: int = 5
    think_max_words: int = 100
    think_names_action_coeff: float = 0.0
    advantage_length_weight: float = 0.0

    def __post_init__(self) -> None:
        for name in ("think_length_coeff", "think_names_action_coeff", "advantage_length_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.advantage_length_weight < 0:
            raise ValueError(f"advantage_length_weight must be >= 0, got {self.advantage_length_weight}")
        if not 0 <= self.think_min_words <= self.think_max_words:
            raise ValueError(
                f"need 0 <= think_min_words <= think_max_words, got {self.think_min_words} and {self.think_max_words}"
            )

    def shape(self, task_reward: float, parsed: ParsedAnswer) -> tuple[float, dict[str, float]]:
        """A turn's shaped reward and the info entries that record how it was made."""
        words = len(parsed.think.split()) if parsed.think is not None else 0
        terms = {
            THINK_LENGTH: think_length_in_band(
                parsed.think, think_min_words=self.think_min_words, think_max_words=self.think_max_words
            ),
            THINK_NAMES_ACTION: thought_names_action(parsed.think, parsed.actions),
        }
        bonus = (
            self.think_length_coeff * terms[THINK_LENGTH] + self.think_names_action_coeff * terms[THINK_NAMES_ACTION]
        )
        return task_reward + bonus, {TASK_REWARD: task_reward, THINK_WORDS: float(words), **terms, SHAPING_BONUS: bonus}


def think_length_in_band(think: str | None, *, think_min_words: int, think_max_words: int) -> float:
    """1.0 when ``think`` has ``think_min_words`` to ``think_max_words`` words (inclusive), else 0.0 (also for None)."""
    if think is None:
        return 0.0
    return float(think_min_words <= len(think.split()) <= think_max_words)


def thought_names_action(think: str | None, actions: Sequence[str]) -> float:
    """The share of ``actions`` named in ``think`` as whole words, case-insensitive; 0.0 without either."""
    if not think or not actions:
        return 0.0
    text = think.lower()
    named = [re.search(rf"(?<!\w){re.escape(action.lower())}(?!\w)", text) is not None for action in actions]
    return sum(named) / len(named)


def shaping_statistics(turn_infos: Iterable[dict]) -> dict[str, float]:
    """``<key>_mean`` over the turns whose info has it, for every key of :data:`TURN_METRICS`."""
    values: dict[str, list[float]] = {key: [] for key in TURN_METRICS}
    for info in turn_infos:
        for key in TURN_METRICS:
            if key in info:
                values[key].append(float(info[key]))
    return {f"{key}_mean": sum(v) / len(v) for key, v in values.items() if v}
