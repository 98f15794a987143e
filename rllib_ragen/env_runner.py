"""`LLMEnvRunner`: rolls out StarPO groups with one batched engine call per turn.

Per iteration it resets `n_groups` `EnvGroup`s (one seed per group), then each
turn collects the prompt of every live trajectory of every group, sends them
to the inference engine in ONE `generate` call, parses the answers, steps the
groups and appends the env's reply as tokens. Each group becomes one
`MultiAgentEpisode`; per turn an agent's episode stores the exact sampled
token ids (action), their sampling log-probs, the prompt piece the model saw
(`user_ids`) and the tokens that closed its message (`close_ids`), so the
learner rebuilds the very token sequence that was sampled.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable

from rllib_ragen.connectors.chat_template import ChatTemplate
from rllib_ragen.connectors.protocol import PromptProtocol, feedback_for
from rllib_ragen.connectors.token_batch import CLOSE_IDS, GROUP_ID, RESPONSE_TEXT, SYSTEM_IDS, USER_IDS
from rllib_ragen.connectors.token_history import TokenHistory
from rllib_ragen.env_group import EnvGroup
from rllib_ragen.inference.engine import InferenceEngine, SamplingParams
from rllib_ragen.inference.factory import make_engine
from rllib_ragen.models import load_tokenizer, resolve_model

logger = logging.getLogger(__name__)

POLICY_PREFIX = "policy."


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Samples StarPO groups; holds the rollout engine (HF in-process or vLLM pool).

    Reads its settings from a `StarPOConfig`. Training seeds start at
    `train_seed_start` and advance by the number of groups per call, so no
    initial state repeats; the next seed is part of the runner's state.
    """

    def __init__(self, *, config, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self.model_path = resolve_model(config.llm_model)
        self.make_env()
        self.make_module()
        self._next_train_seed = config.train_seed_start
        self._group_counter = 0

    @override(EnvRunner)
    def make_env(self) -> None:
        probe = EnvGroup(self.config.env, self.config.env_config, group_size=1, budget=self.config.turn_budget)
        self.template_env = probe.template_env
        template = ChatTemplate.from_tokenizer(load_tokenizer(self.model_path))
        self.protocol = PromptProtocol(
            template,
            instructions=self.template_env.instructions,
            action_vocabulary=self.template_env.action_vocabulary,
            config=self.config.protocol_config,
        )

    @override(EnvRunner)
    def make_module(self) -> None:
        self.engine: InferenceEngine = make_engine(self.config.engine_config, self.model_path)

    @override(EnvRunner)
    def assert_healthy(self) -> None:
        health = self.engine.health()
        assert health.get("healthy", False), f"inference engine unhealthy: {health}"

    @override(EnvRunner)
    def get_spaces(self) -> dict[str, tuple[Any, Any]]:
        spaces = (self.template_env.observation_space, self.template_env.action_space)
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    @override(EnvRunner)
    def sample(
        self,
        *,
        seeds: list[int] | None = None,
        group_size: int | None = None,
        temperature: float | None = None,
        evaluation: bool = False,
        **kwargs,
    ) -> list[MultiAgentEpisode]:
        """Rolls out one group per seed; returns one finished episode per group.

        Args:
            seeds: Initial-state seeds, one group each. Default: the next
                `n_groups` training seeds.
            group_size: Trajectories per group (default: the config's).
            temperature: Sampling temperature (default: the config's).
            evaluation: Log metrics under `evaluation/` names instead of training ones.
        """
        if seeds is None:
            seeds = list(range(self._next_train_seed, self._next_train_seed + self.config.n_groups))
            self._next_train_seed += self.config.n_groups
        group_size = group_size or self.config.group_size
        params = SamplingParams(
            max_new_tokens=self.config.response_length,
            temperature=self.config.temperature if temperature is None else temperature,
            stop_token_ids=self.protocol.stop_token_ids,
        )
        start = time.perf_counter()
        rollout = _GroupRollout(self, seeds, group_size)
        generated_tokens = rollout.run(params)
        self.last_rollout_timing = {"total_s": time.perf_counter() - start, "engine_s": rollout.engine_seconds}
        self._log_rollout_metrics(rollout.episodes, generated_tokens, evaluation)
        return rollout.episodes

    def _log_rollout_metrics(self, episodes, generated_tokens: int, evaluation: bool) -> None:
        stats = rollout_statistics(episodes)
        seconds, engine_seconds = self.last_rollout_timing["total_s"], self.last_rollout_timing["engine_s"]
        stats.update(
            rollout_tokens_per_s=generated_tokens / max(seconds, 1e-9),
            rollout_time_s=seconds,
            # Time outside engine calls: prompt building, parsing, env steps, episodes.
            rollout_framework_overhead=1.0 - engine_seconds / max(seconds, 1e-9),
        )
        prefix = "eval_" if evaluation else ""
        for key, value in stats.items():
            self.metrics.log_value(prefix + key, value, window=1)

    @override(EnvRunner)
    def get_metrics(self) -> dict:
        return self.metrics.reduce()

    @override(Checkpointable)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        return {"next_train_seed": self._next_train_seed}

    @override(Checkpointable)
    def set_state(self, state: dict) -> None:
        """Takes new policy weights (pushed into the engine in place) and the seed cursor."""
        if "next_train_seed" in state:
            self._next_train_seed = state["next_train_seed"]
        module_state = state.get(COMPONENT_RL_MODULE, {}).get(DEFAULT_MODULE_ID)
        if module_state:
            self.engine.update_weights(policy_weights(module_state))

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(EnvRunner)
    def stop(self) -> None:
        self.engine.shutdown()


def policy_weights(module_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """HF-named policy weights from an `LLMRLModule` state (critic dropped)."""
    return {
        key[len(POLICY_PREFIX):]: torch.as_tensor(value)
        for key, value in module_state.items()
        if key.startswith(POLICY_PREFIX)
    }


class _GroupRollout:
    """The turn loop over all groups of one `sample()` call."""

    def __init__(self, runner: LLMEnvRunner, seeds: list[int], group_size: int) -> None:
        self.runner, self.protocol = runner, runner.protocol
        budget = runner.config.turn_budget
        self.groups = [
            EnvGroup(runner.config.env, runner.config.env_config, group_size=group_size, budget=budget)
            for _ in seeds
        ]
        self.episodes = [
            MultiAgentEpisode(agent_module_ids={a: DEFAULT_MODULE_ID for a in g.agents}) for g in self.groups
        ]
        self.histories: dict[tuple[int, str], TokenHistory] = {}
        for index, (group, episode, seed) in enumerate(zip(self.groups, self.episodes, seeds)):
            group_id = runner._group_counter
            runner._group_counter += 1
            observations, infos = group.reset(seed=seed)
            for agent, info in infos.items():
                info.update({SYSTEM_IDS: self.protocol.system_ids, GROUP_ID: group_id})
                history = TokenHistory(self.protocol.system_ids, runner.config.protocol_config.history_window)
                history.add_user(
                    self.protocol.user_ids(
                        observations[agent],
                        turns_left=budget.max_turns,
                        actions_left=budget.max_actions_per_traj,
                    )
                )
                self.histories[(index, agent)] = history
            episode.add_env_reset(observations=observations, infos=infos)
        self.live = list(self.histories)

    def run(self, params: SamplingParams) -> int:
        generated = 0
        self.engine_seconds = 0.0
        while self.live:
            prompts = [self.histories[key].prompt_ids() for key in self.live]
            began = time.perf_counter()
            completions = self.runner.engine.generate(prompts, params)
            self.engine_seconds += time.perf_counter() - began
            by_group: dict[int, dict[str, Any]] = defaultdict(dict)
            for key, completion in zip(self.live, completions):
                by_group[key[0]][key[1]] = completion
                generated += len(completion.token_ids)
            for index, completions_of_group in by_group.items():
                self._step_group(index, completions_of_group)
            self.live = [key for key in self.live if not self._finished(key)]
        return generated

    def _finished(self, key: tuple[int, str]) -> bool:
        episode = self.episodes[key[0]].agent_episodes[key[1]]
        return episode.is_done

    def _step_group(self, index: int, completions: dict[str, Any]) -> None:
        group, episode = self.groups[index], self.episodes[index]
        actions, texts, parsed_answers, extra = {}, {}, {}, {}
        for agent, completion in completions.items():
            history = self.histories[(index, agent)]
            texts[agent], parsed_answers[agent] = self.protocol.parse(completion.token_ids)
            actions[agent] = list(parsed_answers[agent].actions)
            user_ids = history.turns[-1].user_ids
            close_ids = self.protocol.close_ids(completion.token_ids)
            history.add_response(completion.token_ids, completion.logprobs, close_ids)
            extra[agent] = {
                Columns.ACTION_LOGP: np.asarray(completion.logprobs, dtype=np.float32),
                USER_IDS: np.asarray(user_ids, dtype=np.int32),
                CLOSE_IDS: np.asarray(close_ids, dtype=np.int32),
            }
        observations, rewards, terminateds, truncateds, infos = group.step(actions)
        for agent in completions:
            parsed = parsed_answers[agent]
            infos[agent].update({
                RESPONSE_TEXT: texts[agent],
                "format_ok": parsed.format_ok,
                "parsed_actions": list(parsed.actions),
                "finish_reason": completions[agent].finish_reason,
            })
            if not (terminateds[agent] or truncateds[agent]):
                self.histories[(index, agent)].add_user(
                    self.protocol.user_ids(
                        observations[agent],
                        reward=rewards[agent],
                        feedback=feedback_for(parsed),
                        turns_left=infos[agent]["turns_left"],
                        actions_left=infos[agent]["actions_left"],
                    )
                )
        episode.add_env_step(
            observations=observations,
            actions={a: np.asarray(c.token_ids, dtype=np.int32) for a, c in completions.items()},
            rewards=rewards,
            infos=infos,
            terminateds=terminateds,
            truncateds=truncateds,
            extra_model_outputs=extra,
        )


def rollout_statistics(episodes: list[MultiAgentEpisode]) -> dict[str, float]:
    """Success, reward and in-group spread of a list of finished group episodes."""
    returns, successes, in_group_std, lengths, turns, valid_turns = [], [], [], [], [], []
    for episode in episodes:
        group_returns = []
        for agent_episode in episode.agent_episodes.values():
            infos = agent_episode.get_infos()
            group_returns.append(float(sum(agent_episode.get_rewards())))
            successes.append(float(bool(infos[-1].get("success", False))))
            lengths.extend(len(a) for a in agent_episode.get_actions())
            turns.append(len(agent_episode))
            valid_turns.extend(float(i.get("num_valid_actions", 0) > 0) for i in infos[1:])
        returns.extend(group_returns)
        in_group_std.append(float(np.std(group_returns, ddof=1)) if len(group_returns) > 1 else 0.0)
    return {
        "episode_return_mean": float(np.mean(returns)),
        "episode_return_std": float(np.std(returns)),
        "success_rate": float(np.mean(successes)),
        "in_group_reward_std": float(np.mean(in_group_std)),
        "response_length_mean": float(np.mean(lengths)) if lengths else 0.0,
        "num_turns_mean": float(np.mean(turns)),
        "valid_action_ratio": float(np.mean(valid_turns)) if valid_turns else 0.0,
        "num_trajectories": float(len(returns)),
    }
