"""Demonstrations played through the same prompt protocol as a rollout.

Two players answer every turn with a well-formed answer:

- an expert (`expert_demonstrations`, `rllib_ragen.data.experts`): the best
  answer each turn (Sokoban's BFS plan cut into turns, FrozenLake's optimal
  open-loop turn plan), with a thought drawn from the state, e.g.

      <think>Shortest plan from here: Up, Left, Down.</think><answer>Up || Left</answer>

  This is RAGEN's SFT path (its paper: SFT on solver trajectories). With
  `noise`, the env sometimes plays random moves instead while the answers stay
  the expert's (DART, `rllib_ragen.data.disturbed_expert`);
- a random player (`random_demonstrations`, any env): 1..`max_actions_per_turn`
  valid actions drawn at random each turn (`TextEnv.random_action`). This is the
  data of the format warm start: it teaches the answer format, never the task.

Each answer is tokenised like a sampled one (prefill left out, end-of-turn token
appended). Prompts, rewards, feedback and budgets come from the very
`PromptProtocol` and `EnvGroup` an `LLMEnvRunner` uses, so a demonstration
episode is laid out exactly like a rollout episode (group size 1) and trains
the same token rows.

Nobody sampled these tokens, so their sampling log-probs are unknown: the
episodes hold NaN there and the stored rows hold a null `sampling_logp`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs.base import TextEnv
from envs.sokoban_solver import DEFAULT_MAX_STATES
from rllib_ragen.data.disturbed_expert import DisturbedExpert, check_noise
from rllib_ragen.data.experts import Turn, TurnBudgetLeft, expert_for
from rllib_ragen.rollout.env_group import EnvGroup, TurnBudgetSettings, agent_id
from rllib_ragen.rollout.prompt.prompt_protocol import (
    ACTION_SEPARATOR,
    PromptProtocol,
    ProtocolSettings,
    feedback_for,
)
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.trajectory_record import (
    TrajectoryStart,
    TurnRecord,
    start_info,
    turn_info,
    turn_model_outputs,
)

AGENT = agent_id(0)
DISTURBED_ACTIONS = "disturbed_actions"


@dataclasses.dataclass(frozen=True)
class DemonstrationSettings:
    """Which demonstrations to make; protocol and budget must match the run that trains on them.

    Args:
        seeds: Env seeds, one demonstration each (seeds the expert cannot
            play within the budget are skipped).
        env: A registered env with an expert (`rllib_ragen.data.experts`).
        env_config: Keyword config of that env.
        protocol: Prompt settings (think mode, prefill, actions per turn).
        budget: Turn and action budget.
        max_states: Most search states the Sokoban solver visits per room.
        noise: Probability that a turn's moves are disturbed: the env plays random
            valid moves while the answer stays the expert's
            (`rllib_ragen.data.disturbed_expert`). 0 plays the expert's own moves.
        seed: Seeds the disturbances.
    """

    seeds: tuple[int, ...]
    env: str = "sokoban"
    env_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolSettings = ProtocolSettings()
    budget: TurnBudgetSettings = TurnBudgetSettings()
    max_states: int = DEFAULT_MAX_STATES
    noise: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not self.seeds:
            raise ValueError("seeds must name at least one env seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must not repeat: each demonstration is one initial state")
        if self.max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {self.max_states}")
        check_noise(self.noise)
        if self.noise and self.protocol.history_window != 0:
            raise ValueError(
                f"disturbed demonstrations (noise {self.noise}) need a prompt holding the current state only "
                f"(history_window=0, got {self.protocol.history_window}): a disturbed turn's answer is not the "
                "move the env played, so a history would show answers its states contradict"
            )


def expert_demonstrations(tokenizer: Any, config: DemonstrationSettings) -> list[MultiAgentEpisode]:
    """One single-trajectory group episode per seed the expert can play within the budget, in seed order.

    Args:
        tokenizer: The tokenizer of the model that will train on the demonstrations.
        config: Seeds, env, protocol and budget.
    """
    group, protocol = group_and_protocol(tokenizer, config.env, config.env_config, config.protocol, config.budget)
    rng = np.random.default_rng(config.seed)
    episodes: list[MultiAgentEpisode] = []
    with contextlib.closing(group):  # its env may hold a server session (envs.openenv_client)
        for seed in config.seeds:
            reset = group.reset(seed=seed)
            expert = (
                DisturbedExpert(group.template_env, noise=config.noise, rng=rng, max_states=config.max_states)
                if config.noise
                else expert_for(group.template_env, max_states=config.max_states)
            )
            episode = _play(group, protocol, reset, expert, group_id=len(episodes))
            if episode is not None:
                episodes.append(episode)
    return episodes


@dataclasses.dataclass(frozen=True)
class RandomPlaySettings:
    """Random-play demonstrations; protocol and budget must match the run that trains on them.

    Args:
        seeds: Env seeds (initial states); a seed may repeat to get several
            random trajectories from one state.
        env: Any registered env (free-form envs must override `random_action`).
        env_config: Keyword config of that env.
        protocol: Prompt settings (think mode, prefill, actions per turn).
        budget: Turn and action budget.
        seed: Seeds the random choices.
    """

    seeds: tuple[int, ...]
    env: str = "bandit"
    env_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolSettings = ProtocolSettings()
    budget: TurnBudgetSettings = TurnBudgetSettings()
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not self.seeds:
            raise ValueError("seeds must name at least one env seed")


def random_demonstrations(tokenizer: Any, config: RandomPlaySettings) -> list[MultiAgentEpisode]:
    """One single-trajectory group episode per seed, played with random valid actions to the end.

    Each turn takes 1..`max_actions_per_turn` actions and thinks "I will try
    <actions>." The episode ends when the env or the turn budget ends it.
    """
    group, protocol = group_and_protocol(tokenizer, config.env, config.env_config, config.protocol, config.budget)
    rng = np.random.default_rng(config.seed)
    first_actions = _StratifiedFirstActions(rng)
    episodes = []
    with contextlib.closing(group):  # its env may hold a server session (envs.openenv_client)
        for index, seed in enumerate(config.seeds):
            reset = group.reset(seed=seed)
            opening = first_actions.draw(seed, group.template_env.available_actions)
            pending = [opening] if opening is not None else []

            def next_turn(env: TextEnv, left: TurnBudgetLeft, pending: list[str] = pending) -> Turn:
                count = int(rng.integers(1, left.per_turn + 1))
                actions = [pending.pop() if pending else env.random_action(rng) for _ in range(count)]
                return Turn(actions, f"I will try {', '.join(actions)}.")

            episodes.append(_play(group, protocol, reset, next_turn, group_id=index))
    return episodes


class _StratifiedFirstActions:
    """The first action of each trajectory from a state, drawn from a shuffled deck of the state's actions.

    Uniform draws from a handful of trajectories are rarely balanced (16
    states x 2 Bandit answers drew one arm 11 times, the other 21), and the
    model would learn that imbalance as a preference. Dealing each state's
    first actions from a reshuffled deck of its available actions keeps every
    action equally frequent per state while the order stays random.
    Free-form envs (no vocabulary) draw every action with `random_action`.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.decks: dict[int, list[str]] = {}

    def draw(self, seed: int, actions: tuple[str, ...] | None) -> str | None:
        if not actions:
            return None
        deck = self.decks.setdefault(seed, [])
        if not deck:
            deck.extend(self.rng.permutation(actions).tolist())
        return deck.pop()


def group_and_protocol(
    tokenizer: Any,
    env: str,
    env_config: dict[str, Any],
    protocol_settings: ProtocolSettings,
    budget: TurnBudgetSettings,
) -> tuple[EnvGroup, PromptProtocol]:
    group = EnvGroup(env, env_config, group_size=1, budget=budget)
    protocol = PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer),
        instructions=group.template_env.instructions,
        action_vocabulary=group.template_env.action_vocabulary,
        config=protocol_settings,
    )
    return group, protocol


def _play(
    group: EnvGroup,
    protocol: PromptProtocol,
    reset: tuple[dict, dict],
    next_turn: Callable[[Any, TurnBudgetLeft], Turn | None],
    *,
    group_id: int,
) -> MultiAgentEpisode | None:
    """Answers turn by turn with `next_turn(env, budget left)` until the env or the budget ends the episode.

    None when `next_turn` gives up (the player cannot finish within the budget).
    """
    observations, infos = reset
    budget = group.budget
    episode = MultiAgentEpisode(agent_module_ids={AGENT: DEFAULT_MODULE_ID})
    reset_info = {**infos[AGENT], **start_info(TrajectoryStart(protocol.system_ids, group_id))}
    episode.add_env_reset(observations=observations, infos={AGENT: reset_info})
    turns_left, actions_left = budget.max_turns, budget.max_actions_per_traj
    user_ids = protocol.user_ids(observations[AGENT], turns_left=turns_left, actions_left=actions_left)
    while True:
        turn = next_turn(
            group.template_env, TurnBudgetLeft(turns_left, actions_left, protocol.config.max_actions_per_turn)
        )
        if turn is None:
            return None
        response_ids = demonstration_response(protocol, turn.actions, turn.thought)
        text, parsed = protocol.parse(response_ids)
        if list(parsed.actions) != turn.actions:
            raise RuntimeError(f"the tokenised answer {text!r} parses to {list(parsed.actions)}, not {turn.actions}")
        played = turn.actions if turn.played is None else turn.played
        observations, rewards, terminateds, truncateds, infos = group.step({AGENT: played})
        # Nobody sampled these tokens: their sampling log-probs are unknown (NaN).
        record = TurnRecord(user_ids, protocol.close_ids(response_ids), [np.nan] * len(response_ids), text)
        info = {
            **infos[AGENT],
            **turn_info(record),
            "format_ok": parsed.format_ok,
            "parsed_actions": list(parsed.actions),
            "finish_reason": "stop",
            # A disturbed turn (`DisturbedExpert`) names the moves the env played instead of the answer's.
            **({DISTURBED_ACTIONS: turn.played} if turn.played is not None else {}),
        }
        episode.add_env_step(
            actions={AGENT: np.asarray(response_ids, dtype=np.int32)},
            infos={AGENT: info},
            extra_model_outputs={AGENT: turn_model_outputs(record)},
            observations=observations,
            rewards=rewards,
            terminateds=terminateds,
            truncateds=truncateds,
        )
        if terminateds[AGENT] or truncateds[AGENT]:
            return episode
        turns_left, actions_left = info["turns_left"], info["actions_left"]
        user_ids = protocol.user_ids(
            observations[AGENT],
            reward=rewards[AGENT],
            feedback=feedback_for(parsed),
            turns_left=turns_left,
            actions_left=actions_left,
        )


def demonstration_response(protocol: PromptProtocol, actions: list[str], thought: str) -> list[int]:
    """Token ids of a well-formed answer taking `actions`, as the model would generate them.

    The prefill (if any) is already in the prompt, so it is left out; the
    end-of-turn token closes the answer as the engine's stop token would.
    """
    answer = f"<answer>{f' {ACTION_SEPARATOR} '.join(actions)}</answer>"
    if protocol.config.think:
        answer = f"<think>{thought}</think>{answer}"
    template = protocol.template
    return [*template.encode(answer[len(protocol.config.prefill_text) :]), template.eos_token_id]
