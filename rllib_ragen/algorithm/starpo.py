"""`StarPOConfig` / `StarPO`: RAGEN's multi-turn agent RL as an RLlib Algorithm.

One iteration, `StarPO.training_step`, reads top to bottom as numbered steps, each one
call into one module (the table in docs/rllib_integration.md maps each to its file):
    1. sample n_groups x group_size trajectories (`algorithm/group_sampling/`: offline data, the
       local runner, remote runners, or remote runners sampling ahead with async_rollouts)
    2. every few iterations: RAGEN-2's collapse diagnostics I(X;Z), H(Z|X) on sampled first
       turns (`training/collapse_metrics.py`)
    3. group filter: keep the groups with the largest in-group reward std (StarPO-S top-k
       ratio, or RAGEN-2's top-p; `training/filtering.py`); a batch the filter empties is not
       trained on; the echo-trap monitor warns on reward-variance, entropy or template collapse
    4. advantages and update (`update_learners`, below): each learner's connector estimates, whitens and
       length-weights the advantages (`training/advantages/advantage_estimation.py`), then `rollout_frequency`
       passes in mini-batches (with num_learners >= 2, whole groups per DDP learner)
    5. sync the new policy weights into the rollout engine(s), in place (`inference/weight_sync.py`)
    6. every `eval_interval` iterations: evaluate on fixed seeds at eval temperature
       (`rollout/evaluation.py`)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.learner.learner_connector_pipeline import LearnerConnectorPipeline
from ray.rllib.core import COMPONENT_LEARNER_GROUP
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import EVALUATION_RESULTS, LEARNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME, TIMERS

from rllib_ragen.algorithm import export
from rllib_ragen.algorithm.group_sampling.remote_sampler import episodes_of, sample_on_remote_runners
from rllib_ragen.algorithm.group_sampling.sampler_factory import make_group_sampler
from rllib_ragen.algorithm.starpo_settings import StarPOSettings
from rllib_ragen.algorithm.validation import check_starpo_config
from rllib_ragen.inference.weight_sync import PolicyWeightSync
from rllib_ragen.models import load_tokenizer, resolve_model, resolves_locally
from rllib_ragen.rollout.evaluation import evaluate_on_seeds
from rllib_ragen.rollout.game_evaluation import GameScore
from rllib_ragen.rollout.self_play_runner import LEAGUE_ENGINE, SelfPlayEnvRunner
from rllib_ragen.training.collapse_metrics import BatchDiagnostics
from rllib_ragen.training.distributed import count_training_rows, learner_minibatch_sizes, shard_groups
from rllib_ragen.training.filtering import filter_groups
from rllib_ragen.training.learner import StarPOTorchLearner, UpdateSettings, phase_peak
from rllib_ragen.training.learner_connector import GroupAdvantages, OldLogProbsAndValues, TokenRows
from rllib_ragen.training.module import LLMRLModule, module_config
from rllib_ragen.training.token_batch import ResponseSpanLabeller

logger = logging.getLogger(__name__)

ROLLOUT_TIMER = "rollout"
UPDATE_TIMER = "update"
WEIGHT_SYNC_TIMER = "weight_sync"
WEIGHT_SYNC_RESULTS = "weight_sync"
EVAL_TIMER = "evaluation"
DRIVER_PEAK_RSS = "driver_peak_rss_gb"


class StarPOConfig(StarPOSettings):
    """Configuration of StarPO: its settings (`StarPOSettings`: one frozen group per part, each set by a
    builder), and how RLlib builds StarPO from them (its RLModule, learner and learner connector).
    Defaults are RAGEN's v1 base configuration.

    Example:
        config = (
            StarPOConfig()
            .environment("sokoban")
            .llm(model="smollm2-135m-instruct")
            .rollouts(n_groups=8, group_size=16)
            .training(advantage_estimator="gae", rollout_filter_ratio=0.25)
        )
        algo = config.build_algo()
        algo.train()
    """

    def __init__(self, algo_class: type[Algorithm] | None = None) -> None:
        super().__init__(algo_class=algo_class or StarPO)

    # ------------------------------------------------------------ derived parts
    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        # The module gets the groups themselves; it scores tokens at the rollout temperature.
        return RLModuleSpec(
            module_class=LLMRLModule,
            model_config=module_config(self.llm_module, lora=self.lora, logit_temperature=self.rollout.temperature),
        )

    @override(AlgorithmConfig)
    def get_default_learner_class(self) -> type[StarPOTorchLearner]:
        return StarPOTorchLearner

    @override(AlgorithmConfig)
    def build_learner_connector(
        self,
        input_observation_space: gym.Space | None,
        input_action_space: gym.Space | None,
        device: torch.device | None = None,
    ) -> LearnerConnectorPipeline:
        return LearnerConnectorPipeline(
            connectors=self.learner_connector_pieces(),
            input_observation_space=input_observation_space,
            input_action_space=input_action_space,
        )

    def learner_connector_pieces(self, *, score_old_logp: bool | None = None) -> list:
        """Token rows -> old log-probs and values -> advantages (`rllib_ragen.training.learner_connector`).

        Args:
            score_old_logp: Score the old log-probs in a separate pass; None =
                unless each update is one on-policy step (`update_is_one_on_policy_step`).
        """
        if score_old_logp is None:
            score_old_logp = not self.update_is_one_on_policy_step
        return [
            TokenRows(history_window=self.protocol.history_window),
            OldLogProbsAndValues(
                micro_batch_size=self.update.micro_batch_size,
                score_old_logp=score_old_logp,
                with_values=self.advantages.needs_critic,
            ),
            GroupAdvantages(
                advantages=self.advantages,
                loss_token_mask=self.loss.loss_token_mask,
                advantage_token_mask=self.loss.advantage_token_mask,
                span_labeller=self._span_labeller() if self.loss.needs_token_spans else None,
                advantage_length_weight=self.shaping.advantage_length_weight,
            ),
        ]

    def _span_labeller(self) -> ResponseSpanLabeller:
        return ResponseSpanLabeller(load_tokenizer(resolve_model(self.llm_module.model)), self.protocol)

    @override(AlgorithmConfig)
    def validate(self) -> None:
        super().validate()
        self.validate_starpo()

    def validate_starpo(self) -> None:
        """Checks every StarPO setting; raises ValueError naming the bad one.

        No side effects: nothing is built, loaded or read from disk (an env given by
        import path is imported). `check_inputs` reads the model directory, at build.
        """
        check_starpo_config(self)

    def check_inputs(self) -> None:
        """Checks what validation does not read: a local model directory has its config, weights,
        tokenizer and chat template (raises `ModelNotFoundError` or ValueError naming what is missing)."""
        if resolves_locally(self.llm_module.model):
            resolve_model(self.llm_module.model)


class StarPO(Algorithm):
    """StarPO (State-Thinking-Actions-Reward Policy Optimisation) on RLlib."""

    config: StarPOConfig

    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig()

    @override(Algorithm)
    def setup(self, config: StarPOConfig) -> None:
        # Ray gives actors (e.g. Tune trials) OMP_NUM_THREADS=1; the synchronous
        # loop alternates rollout and update, so each may use every core it has.
        torch.set_num_threads(config.update.torch_threads or os.cpu_count() or 1)
        config.check_inputs()
        super().setup(config)
        # Set by a driver that knows where it stops: that iteration always ends with an evaluation.
        self.final_iteration: int | None = None
        # 0/1 success per trajectory of the latest evaluation, in seed order, keyed for pairing
        # (`Evaluation.outcomes`).
        self.last_evaluation_outcomes: dict[str, float] = {}
        # Two-player games: the latest evaluation's outcomes against each fixed opponent, game by game.
        self.last_game_scores: dict[str, GameScore] = {}
        self._evaluation_episodes: list = []
        # The version of the learner's weights; each sync into the engines makes a new one.
        self.policy_version = 0
        # Self-play's league: the iteration whose update its snapshot holds (0: the policy the run started from,
        # also after a restore, which rebuilds the snapshot's engine from that model until the next refresh).
        self.league_iteration = 0
        self.sampler = make_group_sampler(
            self.config,
            self.metrics,
            offline_data=self.offline_data,
            env_runner=self.env_runner,
            env_runner_group=self.env_runner_group,
            policy_version=lambda: self.policy_version,
        )
        self.diagnostics = BatchDiagnostics(
            config.collapse_metrics,
            config.echo_trap,
            self.metrics,
            protocol=config.protocol,
            model=config.llm_module.model,
            micro_batch_size=config.update.micro_batch_size,
            seed=config.seed or 0,
        )
        self.weight_sync = PolicyWeightSync(
            config=config.rollout_engine,
            lora=config.lora,
            learner_group=self.learner_group,
            env_runner_group=self.env_runner_group,
        )
        # The engines loaded the checkpoint themselves; this first sync proves the path at start.
        self.sync_engine_weights()
        self._engine_restarts_checked = 0

    @override(Algorithm)
    def training_step(self) -> None:
        """One iteration; each numbered step is one call into the module named beside it."""
        iteration = self.iteration + 1
        # 1. Sample this iteration's groups (algorithm/group_sampling/).
        with self._phase(ROLLOUT_TIMER):
            episodes = self.sampler.sample(iteration=iteration)
        self._check_replaced_engines()
        # 2. Collapse diagnostics, before the filter, under the weights that sampled (training/collapse_metrics.py).
        collapse = self.diagnostics.measure_collapse(episodes, iteration=iteration, learner_group=self.learner_group)
        # 3. Filter: keep the groups whose rewards disagree most (training/filtering.py); watch for the echo trap.
        filtered = filter_groups(episodes, self.config.group_filter, self.metrics)
        self.diagnostics.watch_echo_trap(collapse, in_group_reward_std=filtered.in_group_reward_std)
        if filtered.kept:
            # 4. Advantages and update (update_learners, below): each learner's connector estimates, whitens and
            #    length-weights the advantages (training/advantages/advantage_estimation.py), then the loss
            #    trains on them.
            with self._phase(UPDATE_TIMER):
                learner_results = update_learners(
                    self.learner_group,
                    filtered.kept,
                    self.config.update,
                    history_window=self.config.protocol.history_window,
                    iteration=iteration,
                )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
            # 5. Sync the new weights into every rollout engine (inference/weight_sync.py), and into self-play's
            #    league snapshot when its refresh is due.
            self._sync_after_update()
            self._refresh_league(iteration)
        else:  # RAGEN-2 skips such a step too: no group has a signal to learn from
            logger.warning(
                "iteration %d: the group filter kept no group (no in-group reward spread); no update this iteration",
                iteration,
            )
        # 6. Every `eval_interval` iterations (and the last): evaluate on the fixed seeds (rollout/evaluation.py).
        if self._evaluation_due(iteration):
            logger.info("iteration %d: evaluating on the %d fixed seeds", iteration, self.config.starpo_eval.eval_size)
            self.evaluate_fixed_seeds()

    def _check_replaced_engines(self) -> None:
        """After a rollout in which the local env runner's engine pool replaced a dead engine: the probe
        scored again on every engine. The learner's weights are still the ones last synced (the update
        comes later), so `weight_sync/replaced_engine_logp_max_abs_diff` (against the learner) should
        equal the sync's own gap, and `weight_sync/replaced_engine_drift` (against what the engines
        scored after that sync) be float noise: a replacement serving other weights (the checkpoint's)
        shows in both. `engine_restarts` counts the replacements since this process started."""
        restarts = 0 if self.env_runner is None else self.env_runner.engine.restarts
        if restarts > self._engine_restarts_checked:
            self._engine_restarts_checked = restarts
            synced = self.weight_sync.engine_scores
            gap = self.weight_sync.check()
            drift = max(
                abs(a - b) for old, new in zip(synced, self.weight_sync.engine_scores, strict=True)
                for a, b in zip(old, new, strict=True)
            )  # fmt: skip
            self.metrics.log_value((WEIGHT_SYNC_RESULTS, "replaced_engine_logp_max_abs_diff"), gap, window=1)
            self.metrics.log_value((WEIGHT_SYNC_RESULTS, "replaced_engine_drift"), drift, window=1)
        self.metrics.log_value("engine_restarts", restarts, window=1)

    def _sync_after_update(self) -> None:
        """The new weights into every rollout engine, once the rollouts still running (async) are in."""
        self.sampler.drain()  # async rollouts: the shards in flight finish with the weights they started with
        with self._phase(WEIGHT_SYNC_TIMER):
            self.sync_engine_weights()

    def _refresh_league(self, iteration: int) -> None:
        """Self-play's league: every `league_refresh_interval` iterations its snapshot takes the weights just
        synced; `self_play/league_iteration` logs the iteration whose update it holds, and
        `self_play/league_sync_seconds` what a refresh took (apart from `timers/weight_sync`, which stays the
        rollout engines' sync alone)."""
        games = self.config.two_player
        if not games.league:
            return
        if games.league_refresh_due(iteration):
            report = self.weight_sync.sync_snapshot(LEAGUE_ENGINE)
            self.metrics.log_value(("self_play", "league_sync_seconds"), report.seconds, window=1)
            self.league_iteration = iteration
        self.metrics.log_value(("self_play", "league_iteration"), self.league_iteration, window=1)

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Times a phase of the iteration (`timers/<name>`) and logs the driver's peak resident set during it
        (`driver_peak_rss_gb/<name>`): the update's is the local learner's when it runs here."""
        with self.metrics.log_time((TIMERS, name)), phase_peak() as peak:
            yield
        if "bytes" in peak:
            self.metrics.log_value((DRIVER_PEAK_RSS, name), peak["bytes"] / 2**30, window=1)

    def _evaluation_due(self, iteration: int) -> bool:
        interval = self.config.starpo_eval.eval_interval
        return bool(interval) and (iteration % interval == 0 or iteration == self.final_iteration)

    def sync_engine_weights(self) -> None:
        """Loads the learner's policy into every rollout engine, then checks it there.

        Logs `weight_sync/seconds`, `weight_sync/megabytes` and
        `weight_sync/engine_logp_max_abs_diff`: the largest difference between an
        engine's and the learner's log-probs of a fixed probe continuation (about
        1e-3 or less with matching dtypes; stale engine weights show as a large value).
        """
        self.policy_version += 1
        report = self.weight_sync.sync(version=self.policy_version)
        gap = self.weight_sync.check()
        for key, value in (
            ("seconds", report.seconds),
            ("megabytes", report.nbytes / 2**20),
            ("engine_logp_max_abs_diff", gap),
        ):
            self.metrics.log_value((WEIGHT_SYNC_RESULTS, key), value, window=1)

    def evaluate_fixed_seeds(self) -> dict[str, float]:
        """Success (with its 95% interval) and reward on the fixed evaluation instances (group size 1)."""
        settings = self.config.starpo_eval
        seeds = list(settings.seeds)
        with self._phase(EVAL_TIMER):
            evaluation = evaluate_on_seeds(self._sample_evaluation, seeds=seeds, temperature=settings.eval_temperature)
            stats = dict(evaluation.stats)
            if isinstance(self.env_runner, SelfPlayEnvRunner):  # two-player games: rates against fixed opponents
                self.last_game_scores = self.env_runner.game_scores(
                    first_seed=seeds[0], temperature=settings.eval_temperature
                )
                for opponent, score in self.last_game_scores.items():
                    stats |= score.metrics(f"vs_{opponent}/")
        for key, value in stats.items():
            self.metrics.log_value((EVALUATION_RESULTS, key), value, window=1)
        self._evaluation_episodes = evaluation.episodes
        self.last_evaluation_outcomes = evaluation.outcomes
        return stats

    def _sample_evaluation(self, **sample_kwargs: Any) -> list[MultiAgentEpisode]:
        """Evaluation groups on the local runner, or on the remote runners (their metrics not reported)."""
        if self.env_runner is not None:
            return self.env_runner.sample(**sample_kwargs)
        return episodes_of(sample_on_remote_runners(self.env_runner_group, **sample_kwargs))

    def pop_evaluation_episodes(self) -> list:
        """The episodes of the latest evaluation not yet taken (for trajectory pages)."""
        episodes, self._evaluation_episodes = self._evaluation_episodes, []
        return episodes

    @override(Algorithm)
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        state = super().get_state(components, not_components=not_components, **kwargs)
        state.update(self.sampler.get_state())  # the training-seed cursor
        return state

    @override(Algorithm)
    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.sampler.set_state(state)
        if COMPONENT_LEARNER_GROUP in state:
            self.sync_engine_weights()

    @override(Algorithm)
    def restore_from_path(self, path: str | Path, *args: Any, **kwargs: Any) -> None:
        super().restore_from_path(path, *args, **kwargs)
        # RLlib restores the learner group from its own directory, not through set_state.
        self.sync_engine_weights()

    @override(Algorithm)
    def cleanup(self) -> None:
        self.sampler.close()
        self.weight_sync.close()
        super().cleanup()

    def export_policy(self, directory: str | Path, *, adapter: bool = False) -> Path:
        """Writes the trained policy as a plain Hugging Face model directory (`rllib_ragen.algorithm.export`).

        Args:
            directory: Where to write it (created when missing).
            adapter: Under LoRA, write a PEFT adapter directory instead.
        """
        return export.export_policy(
            self.learner_group, self.config.llm_module, self.config.lora, directory, adapter=adapter
        )


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
