"""`LLMEnvRunner`: rolls out StarPO groups with one batched engine call per turn.

Per iteration it resets `n_groups` `EnvGroup`s (one seed per group), then each
turn collects the prompt of every live trajectory of every group, sends them
to the inference engine in ONE `generate` call, parses the answers, steps the
groups and appends the env's reply as tokens. Each group becomes one
`MultiAgentEpisode`; per turn an agent's episode stores the exact sampled
token ids (action), their sampling log-probs, the prompt piece the model saw
(`user_ids`) and the tokens that closed its message (`close_ids`), so the
learner rebuilds the very token sequence that was sampled.

Each turn's reward is the env's (the task reward) plus the configured
reasoning-aware shaping (`rllib_ragen.rollout.reward_shaping`, off by default); the
turn's info keeps the task reward and every shaping term, and the prompt of the
next turn shows the task reward.

Robustness: a faulty env (raises, hangs past `env_step_timeout_s`, returns
garbage) ends only its own trajectory (`EnvGroup`), counted in the `env_errors`
metric. A trajectory whose next prompt would leave less than `response_length`
tokens of `max_model_len` is truncated there, counted in
`truncated_prompt_trajectories`; a first prompt that is already too long for
the training seeds is an error when the runner starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable

from rllib_ragen.inference.engine import InferenceEngine, SamplingParams
from rllib_ragen.inference.engine_factory import make_engine
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.models import load_tokenizer, resolve_model
from rllib_ragen.rollout.env_group import EnvGroup, RolloutSettings, TurnBudgetSettings, training_env_config
from rllib_ragen.rollout.prompt.prompt_protocol import ParsedAnswer, PromptProtocol, feedback_for
from rllib_ragen.rollout.prompt.token_history import ChatTemplate, TokenHistory
from rllib_ragen.rollout.reward_shaping import RewardShapingSettings
from rllib_ragen.rollout.trajectory_record import (
    TrajectoryStart,
    TurnRecord,
    rollout_statistics,
    start_info,
    turn_info,
    turn_model_outputs,
)

logger = logging.getLogger(__name__)

POLICY_PREFIX = "policy."


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Samples StarPO groups; holds the rollout engine (HF in-process or vLLM pool).

    Reads its settings from a `StarPOConfig`. The runner keeps no seeds: the
    algorithm's sampler (`rllib_ragen.algorithm.group_sampling`) owns the training-seed
    cursor and passes each call its seeds.
    """

    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        # The config's groups this runner reads, typed (RLlib types `self.config` as its own base class).
        self.rollout: RolloutSettings = config.rollout
        self.turn_budget: TurnBudgetSettings = config.turn_budget
        self.engine_settings: EngineSettings = config.rollout_engine
        self.model_path = resolve_model(config.llm_module.model)
        self.make_env()
        self.make_module()
        self._group_counter = 0
        # The version of the weights the engine holds: 0 is the model it was built from;
        # the weight sync sets it with every load, and every group sampled carries it.
        self.policy_version = 0

    def next_group_id(self) -> int:
        """A group id no other runner of the run hands out.

        Remote runner i (worker_index i >= 1) of N takes ids i - 1, i - 1 + N, ...;
        the local runner 0, 1, 2, ... Groups sampled by different runners land in
        one learner batch, where the id tells groups apart (GRPO statistics).
        """
        stride = max(int(self.config.num_env_runners), 1)
        offset = max((self.worker_index or 0) - 1, 0)
        group_id = self._group_counter * stride + offset
        self._group_counter += 1
        return group_id

    @override(EnvRunner)
    def make_env(self) -> None:
        config = self.config
        # The training rooms: the first prompt checked below is a training one.
        probe = EnvGroup(
            config.env,
            training_env_config(config.env_config, self.rollout),
            group_size=1,
            budget=self.turn_budget,
            step_timeout_s=self.rollout.env_step_timeout_s,
        )
        self.template_env = probe.template_env
        template = ChatTemplate.from_tokenizer(load_tokenizer(self.model_path))
        self.protocol = PromptProtocol(
            template,
            instructions=self.template_env.instructions,
            action_vocabulary=self.template_env.action_vocabulary,
            config=config.protocol,
        )
        self.reward_shaping: RewardShapingSettings = config.shaping
        try:
            self._check_first_prompt_fits(probe)
        finally:
            probe.close()  # the template env keeps serving its instructions and spaces

    def _check_first_prompt_fits(self, probe: EnvGroup) -> None:
        """Fails before any rollout when the first training prompt leaves no room for the response."""
        env, seed = self.config.env, self.rollout.train_seed_start
        observations, _ = probe.reset(seed=seed)
        if not observations:
            raise RuntimeError(f"env {env!r} cannot reset with seed {seed}: {probe.errors}")
        budget = self.turn_budget
        user_ids = self.protocol.user_ids(
            next(iter(observations.values())), turns_left=budget.max_turns, actions_left=budget.max_actions_per_traj
        )
        length = len(self.protocol.system_ids) + len(user_ids)
        response_length, max_model_len = self.rollout.response_length, self.engine_settings.max_model_len
        if length + response_length > max_model_len:
            raise ValueError(
                f"the first prompt of env {env!r} (seed {seed}) is {length} tokens: with "
                f"response_length={response_length} it exceeds max_model_len={max_model_len}; "
                "raise .inference(max_model_len=...) or lower .rollouts(response_length=...)"
            )

    @override(EnvRunner)
    def make_module(self) -> None:
        self.engine: InferenceEngine = make_engine(
            self.engine_settings, self.model_path, seed=self.config.seed or 0, lora=self.config.lora
        )

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
        **kwargs: Any,
    ) -> list[MultiAgentEpisode]:
        """Rolls out one group per seed; returns one finished episode per group.

        Args:
            seeds: Initial-state seeds, one group each. Default: the first
                `n_groups` training seeds (from `train_seed_start`).
            group_size: Trajectories per group (default: the config's).
            temperature: Sampling temperature (default: the config's).
            evaluation: An evaluation rollout: logs none of the runner's
                (training) metrics; the caller reports it (StarPO under `evaluation/`).
        """
        settings = self.rollout
        if seeds is None:
            seeds = list(range(settings.train_seed_start, settings.train_seed_start + settings.n_groups))
        group_size = group_size or settings.group_size
        params = SamplingParams(
            max_new_tokens=settings.response_length,
            temperature=settings.temperature if temperature is None else temperature,
            stop_token_ids=self.protocol.stop_token_ids,
        )
        start = time.perf_counter()
        # Evaluation plays the standard env_config; training, its overrides (a curriculum) on top.
        env_config = self.config.env_config if evaluation else training_env_config(self.config.env_config, settings)
        rollout = _GroupRollout(self, seeds, group_size, env_config=env_config or {})
        try:
            tokens = rollout.run(params)
        finally:
            rollout.close()
        # env_step_s: inside env reset/step; prompt_build_s: prompt tokens, parsing, histories.
        self.last_rollout_timing = {"total_s": time.perf_counter() - start, **rollout.timing}
        if not evaluation:
            self._log_rollout_metrics(rollout, tokens)
        return rollout.episodes

    def _log_rollout_metrics(self, rollout: _GroupRollout, tokens: RolloutTokens) -> None:
        stats = rollout_statistics(rollout.episodes)
        stats.update(env_errors=rollout.env_errors, truncated_prompt_trajectories=rollout.truncated_prompts)
        seconds, engine_seconds = self.last_rollout_timing["total_s"], self.last_rollout_timing["engine_s"]
        stats.update(
            rollout_tokens_per_s=tokens.generated / max(seconds, 1e-9),
            # Prompt positions the engine computed (its prefix cache's hits left out): with short answers
            # after long prompts, most of a rollout's compute.
            rollout_prefill_tokens_per_s=tokens.prefilled / max(seconds, 1e-9),
            rollout_time_s=seconds,
            # Time outside engine calls: prompt building, parsing, env steps, episodes.
            rollout_framework_overhead=1.0 - engine_seconds / max(seconds, 1e-9),
        )
        for key, value in stats.items():
            self.metrics.log_value(key, value, window=1)

    @override(EnvRunner)
    def get_metrics(self) -> dict:
        return self.metrics.reduce()

    @override(Checkpointable)
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        """Nothing: the training-seed cursor is the algorithm's, and the weights are the learner's."""
        return {}

    @override(Checkpointable)
    def set_state(self, state: dict) -> None:
        """Ignores the module weights RLlib sends here (at setup and restore): the engine gets
        the policy from StarPO's own weight sync (`rllib_ragen.inference.weight_sync`), which
        keeps the dtype and checks the result."""

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict[str, Any]]:
        return (), {"config": self.config}

    @override(EnvRunner)
    def stop(self) -> None:
        self.engine.shutdown()


def policy_weights(module_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """HF-named policy weights from an `LLMRLModule` state (critic dropped)."""
    return {
        key[len(POLICY_PREFIX) :]: torch.as_tensor(value)
        for key, value in module_state.items()
        if key.startswith(POLICY_PREFIX)
    }


@dataclasses.dataclass
class RolloutTokens:
    """Tokens one rollout's engine calls computed: sampled, and prompt positions prefilled (cache hits left out)."""

    generated: int = 0
    prefilled: int = 0


class _GroupRollout:
    """The turn loop over all groups of one `sample()` call.

    Groups whose every member failed to reset, or whose first prompt is
    already too long, are left out of `episodes`.
    """

    def __init__(self, runner: LLMEnvRunner, seeds: list[int], group_size: int, *, env_config: dict) -> None:
        self.runner, self.protocol = runner, runner.protocol
        env, settings = runner.config.env, runner.rollout
        self.max_prompt_len = runner.engine_settings.max_model_len - settings.response_length
        self.timing = {"engine_s": 0.0, "env_step_s": 0.0, "prompt_build_s": 0.0}
        self.truncated_prompts = 0
        self.all_groups = [
            EnvGroup(
                env,
                env_config,
                group_size=group_size,
                budget=runner.turn_budget,
                step_timeout_s=settings.env_step_timeout_s,
                group_randomness=settings.group_randomness,
            )
            for _ in seeds
        ]
        self.groups: list[EnvGroup] = []
        self.episodes: list[MultiAgentEpisode] = []
        self.histories: dict[tuple[int, str], TokenHistory] = {}
        try:
            for group, seed in zip(self.all_groups, seeds):
                self._start_group(group, seed)
        except BaseException:
            self.close()
            raise
        if not self.groups:
            self.close()
            errors = [line for g in self.all_groups for line in g.errors]
            raise RuntimeError(
                f"no group of env {env!r} could start (seeds {seeds[0]}..{seeds[-1]}): "
                f"{self.truncated_prompts} trajectories had a first prompt longer than "
                f"max_model_len - response_length = {self.max_prompt_len} tokens; env errors: {errors[:5]}"
            )
        self.live = list(self.histories)

    def close(self) -> None:
        """Closes every group's envs (the episodes are kept)."""
        for group in self.all_groups:
            group.close()

    @property
    def env_errors(self) -> int:
        return sum(len(group.errors) for group in self.all_groups)

    @contextlib.contextmanager
    def _timed(self, key: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.timing[key] += time.perf_counter() - began

    def _start_group(self, group: EnvGroup, seed: int) -> None:
        """Resets `group` and opens its episode and token histories, unless no member can start."""
        budget, runner = group.budget, self.runner
        group_id = runner.next_group_id()
        with self._timed("env_step_s"):
            observations, infos = group.reset(seed=seed)
        with self._timed("prompt_build_s"):
            histories = {}
            for agent in observations:
                history = TokenHistory(self.protocol.system_ids, self.protocol.config.history_window)
                history.add_user(
                    self.protocol.user_ids(
                        observations[agent], turns_left=budget.max_turns, actions_left=budget.max_actions_per_traj
                    )
                )
                histories[agent] = history
        too_long = [a for a, h in histories.items() if len(h.prompt_ids()) > self.max_prompt_len]
        if too_long:
            self.truncated_prompts += len(too_long)
            logger.warning(
                "env %r seed %s: the first prompt exceeds max_model_len - response_length = %d tokens; "
                "%d trajectories left out",
                group.env_name,
                seed,
                self.max_prompt_len,
                len(too_long),
            )
        keep = [a for a in histories if a not in too_long]
        if not keep:
            return
        for agent in group.agents:
            if agent not in keep:
                group.end(agent)
        index = len(self.groups)
        episode = MultiAgentEpisode(agent_module_ids={a: DEFAULT_MODULE_ID for a in keep})
        start = start_info(TrajectoryStart(self.protocol.system_ids, group_id, runner.policy_version))
        for agent in keep:
            infos[agent].update(start)
            self.histories[(index, agent)] = histories[agent]
        episode.add_env_reset(observations={a: observations[a] for a in keep}, infos={a: infos[a] for a in keep})
        self.groups.append(group)
        self.episodes.append(episode)

    def run(self, params: SamplingParams) -> RolloutTokens:
        """Plays every live trajectory to its end; returns the tokens the engine computed."""
        tokens = RolloutTokens()
        while self.live:
            with self._timed("prompt_build_s"):
                prompts = [self.histories[key].prompt_ids() for key in self.live]
            with self._timed("engine_s"):
                completions = self.runner.engine.generate(prompts, params)
            by_group: dict[int, dict[str, Any]] = defaultdict(dict)
            for key, prompt, completion in zip(self.live, prompts, completions):
                by_group[key[0]][key[1]] = completion
                tokens.generated += len(completion.token_ids)
                tokens.prefilled += len(prompt) - completion.cached_prompt_tokens
            for index, completions_of_group in by_group.items():
                self._step_group(index, completions_of_group)
            self.live = [key for key in self.live if not self._finished(key)]
        return tokens

    def _finished(self, key: tuple[int, str]) -> bool:
        episode = self.episodes[key[0]].agent_episodes[key[1]]
        return episode.is_done

    def _step_group(self, index: int, completions: dict[str, Any]) -> None:
        group, episode = self.groups[index], self.episodes[index]
        actions, turns, parsed_answers = {}, {}, {}
        with self._timed("prompt_build_s"):
            for agent, completion in completions.items():
                history = self.histories[(index, agent)]
                text, parsed_answers[agent] = self.protocol.parse(completion.token_ids)
                actions[agent] = list(parsed_answers[agent].actions)
                close_ids = self.protocol.close_ids(completion.token_ids)
                turns[agent] = TurnRecord(history.turns[-1].user_ids, close_ids, completion.logprobs, text)
                history.add_response(completion.token_ids, completion.logprobs, close_ids)
        with self._timed("env_step_s"):
            observations, rewards, terminateds, truncateds, infos = group.step(actions)
        with self._timed("prompt_build_s"):
            for agent in completions:
                parsed = parsed_answers[agent]
                infos[agent].update(
                    {
                        **turn_info(turns[agent]),
                        "format_ok": parsed.format_ok,
                        "parsed_actions": list(parsed.actions),
                        "finish_reason": completions[agent].finish_reason,
                    }
                )
                if not (terminateds[agent] or truncateds[agent]) and not self._continue(
                    self.histories[(index, agent)], observations[agent], rewards[agent], parsed, infos[agent]
                ):
                    truncateds[agent] = True
                    group.end(agent)
                rewards[agent], shaping = self.runner.reward_shaping.shape(rewards[agent], parsed)
                infos[agent].update(shaping)
        terminateds["__all__"] = truncateds["__all__"] = group.all_done
        episode.add_env_step(
            observations=observations,
            actions={a: np.asarray(c.token_ids, dtype=np.int32) for a, c in completions.items()},
            rewards=rewards,
            infos=infos,
            terminateds=terminateds,
            truncateds=truncateds,
            extra_model_outputs={agent: turn_model_outputs(turn) for agent, turn in turns.items()},
        )

    def _continue(
        self, history: TokenHistory, observation: str, reward: float, parsed: ParsedAnswer, info: dict
    ) -> bool:
        """Appends the next user turn; False (and `info["prompt_truncated"]`) when that prompt is too long.

        The unanswered user turn left in `history` is never trained on.
        """
        history.add_user(
            self.protocol.user_ids(
                observation,
                reward=reward,
                feedback=feedback_for(parsed),
                turns_left=info["turns_left"],
                actions_left=info["actions_left"],
            )
        )
        if len(history.prompt_ids()) <= self.max_prompt_len:
            return True
        info["prompt_truncated"] = True
        self.truncated_prompts += 1
        return False
