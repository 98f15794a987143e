"""Sokoban solver demonstrations, played through the same prompt protocol as a rollout.

For each seed, the breadth-first solver (`envs.sokoban_solver.solve`) finds a
shortest plan; the plan is cut into turns of at most `max_actions_per_turn`
actions, and each turn's "response" is a well-formed answer

    <think>Shortest plan from here: Up, Left, Down.</think><answer>Up || Left</answer>

tokenised like a sampled one (prefill left out, end-of-turn token appended).
Prompts, rewards, feedback and budgets come from the very `PromptProtocol` and
`EnvGroup` an `LLMEnvRunner` uses, so a demonstration episode is laid out
exactly like a rollout episode (group size 1) and trains the same token rows.

Nobody sampled these tokens, so their sampling log-probs are unknown: the
episodes hold NaN there and the stored rows hold a null `sampling_logp`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs.sokoban_solver import DEFAULT_MAX_STATES, solve
from rllib_ragen.connectors.answer_parser import ACTION_SEPARATOR
from rllib_ragen.connectors.chat_template import ChatTemplate
from rllib_ragen.connectors.protocol import PromptProtocol, ProtocolConfig, feedback_for
from rllib_ragen.connectors.token_batch import CLOSE_IDS, GROUP_ID, SYSTEM_IDS, USER_IDS
from rllib_ragen.data.convert import RESPONSE_TEXT
from rllib_ragen.env_group import EnvGroup, TurnBudget, agent_id

AGENT = agent_id(0)


@dataclasses.dataclass(frozen=True)
class DemonstrationConfig:
    """Which demonstrations to make; protocol and budget must match the run that trains on them.

    Args:
        seeds: Env seeds, one demonstration each (seeds the solver cannot
            solve within the budget are skipped).
        env: A registered env whose instances have a Sokoban `room`.
        env_config: Keyword config of that env.
        protocol: Prompt settings (think mode, prefill, actions per turn).
        budget: Turn and action budget.
        max_states: Most search states the solver visits per room.
    """

    seeds: tuple[int, ...]
    env: str = "sokoban"
    env_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolConfig = ProtocolConfig()
    budget: TurnBudget = TurnBudget()
    max_states: int = DEFAULT_MAX_STATES

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        if not self.seeds:
            raise ValueError("seeds must name at least one env seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must not repeat: each demonstration is one initial state")
        if self.max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {self.max_states}")

    @property
    def max_plan_length(self) -> int:
        """Longest plan that fits the budget."""
        per_turns = self.budget.max_turns * self.protocol.max_actions_per_turn
        return min(per_turns, self.budget.max_actions_per_traj)


def solver_demonstrations(tokenizer: Any, config: DemonstrationConfig) -> list[MultiAgentEpisode]:
    """One single-trajectory group episode per seed solved within the budget, in seed order.

    Args:
        tokenizer: The tokenizer of the model that will train on the demonstrations.
        config: Seeds, env, protocol and budget.
    """
    group = EnvGroup(config.env, config.env_config, group_size=1, budget=config.budget)
    protocol = PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer),
        instructions=group.template_env.instructions,
        action_vocabulary=group.template_env.action_vocabulary,
        config=config.protocol,
    )
    episodes = []
    for seed in config.seeds:
        observations, infos = group.reset(seed=seed)
        plan = solve(group.template_env, max_states=config.max_states)
        if not plan or len(plan) > config.max_plan_length:
            continue
        episode = MultiAgentEpisode(agent_module_ids={AGENT: DEFAULT_MODULE_ID})
        reset_info = {**infos[AGENT], SYSTEM_IDS: protocol.system_ids, GROUP_ID: len(episodes)}
        episode.add_env_reset(observations=observations, infos={AGENT: reset_info})
        _play(group, protocol, episode, observations[AGENT], plan, config.budget)
        episodes.append(episode)
    return episodes


def _play(
    group: EnvGroup, protocol: PromptProtocol, episode: MultiAgentEpisode, observation: str,
    plan: list[str], budget: TurnBudget,
) -> None:
    """Answers turn by turn with the next chunk of the plan until the env ends the episode."""
    user_ids = protocol.user_ids(observation, turns_left=budget.max_turns, actions_left=budget.max_actions_per_traj)
    step = protocol.config.max_actions_per_turn
    for start in range(0, len(plan), step):
        chunk = plan[start : start + step]
        response_ids = demonstration_response(protocol, chunk, plan[start:])
        text, parsed = protocol.parse(response_ids)
        if list(parsed.actions) != chunk:
            raise RuntimeError(f"the tokenised answer {text!r} parses to {list(parsed.actions)}, not {chunk}")
        observations, rewards, terminateds, truncateds, infos = group.step({AGENT: chunk})
        info = {**infos[AGENT], RESPONSE_TEXT: text, "format_ok": parsed.format_ok,
                "parsed_actions": list(parsed.actions), "finish_reason": "stop"}
        episode.add_env_step(
            observations=observations,
            actions={AGENT: np.asarray(response_ids, dtype=np.int32)},
            rewards=rewards,
            infos={AGENT: info},
            terminateds=terminateds,
            truncateds=truncateds,
            extra_model_outputs={AGENT: {
                Columns.ACTION_LOGP: np.full(len(response_ids), np.nan, dtype=np.float32),
                USER_IDS: np.asarray(user_ids, dtype=np.int32),
                CLOSE_IDS: np.asarray(protocol.close_ids(response_ids), dtype=np.int32),
            }},
        )
        if terminateds[AGENT] or truncateds[AGENT]:
            return
        user_ids = protocol.user_ids(
            observations[AGENT], reward=rewards[AGENT], feedback=feedback_for(parsed),
            turns_left=info["turns_left"], actions_left=info["actions_left"],
        )


def demonstration_response(protocol: PromptProtocol, actions: list[str], remaining_plan: list[str]) -> list[int]:
    """Token ids of a well-formed answer taking `actions`, as the model would generate them.

    The prefill (if any) is already in the prompt, so it is left out; the
    end-of-turn token closes the answer as the engine's stop token would.
    """
    answer = f"<answer>{f' {ACTION_SEPARATOR} '.join(actions)}</answer>"
    if protocol.config.think:
        answer = f"<think>Shortest plan from here: {', '.join(remaining_plan)}.</think>{answer}"
    template = protocol.template
    return template.encode(answer[len(protocol.config.prefill_text):]) + [template.eos_token_id]
