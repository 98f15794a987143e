"""Supervised warm starts: the answer format (random play), or the task itself (an expert's play).

Small models (SmolLM2-135M, and of course a random tiny model) almost never
write `<think>...</think><answer>...</answer>` zero-shot, so RL sees no reward
signal at all. The warm start plays the env with a random player
(`rllib_ragen.data.demonstrations.random_demonstrations`: multi-turn, 1..k valid
actions per turn drawn uniformly at random, never a solver's choice), writes
those trajectories to Parquet, and behaviour-clones them through RLlib's offline
API (`rllib_ragen.algorithm.offline`: the same `LLMRLModule`, `BCTorchLearner` and
micro-batching as StarPO). Afterwards the model follows the format while its
choices are still random, so any later gain in success is the RL's doing.

With `player="expert"` the trajectories are an expert's instead
(`rllib_ragen.data.experts`: Sokoban's BFS plans, FrozenLake's optimal turn
plans, with thoughts drawn from the state): RAGEN's SFT path, a starting
policy that already solves part of the task, for RL to improve on.

The result is a Hugging Face model directory cached like the built-in models
(per base model, env and prompt format; built once, safe against concurrent
builders) and usable wherever a model name is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs import make_env
from rllib_ragen.algorithm.offline import OfflineSettings, offline_config
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.demonstrations import (
    DemonstrationConfig,
    RandomPlayConfig,
    expert_demonstrations,
    random_demonstrations,
)
from rllib_ragen.data.experts import WARM_START_PLAYERS
from rllib_ragen.data.parquet import write_trajectories
from rllib_ragen.models import (
    BuiltinModel,
    default_cache_dir,
    load_tokenizer,
    prepare_builtin,
    resolve_model,
)
from rllib_ragen.rollout.env_group import TurnBudget
from rllib_ragen.rollout.prompt.protocol import ProtocolConfig
from rllib_ragen.run.ray_session import init_ray

# Part of the cache key: a change to how the warm start trains, or to the text of the
# demonstrations it trains on (e.g. an expert's thought), must bump it so old results are not reused.
WARM_START_METHOD = "bc-6"


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """What the warm start trains on.

    Args:
        env: Registered env that is played.
        env_config: Keyword config of that env.
        protocol: Prompt settings; must match the later RL run's (the cache
            is per prompt format).
        budget: Turn budget; must match the later RL run's.
        num_examples: Distinct initial states (one env seed each).
        answers_per_prompt: Random trajectories played from each state;
            several per state teach a spread-out choice instead of one
            arbitrary answer.
        epochs: Passes over the trajectories.
        batch_size: Trajectories per optimiser step.
        lr: AdamW learning rate.
        seed: Seeds the env instances, the random actions and the model.
        player: "random" (valid actions at random: teaches the format only)
            or "expert" (the env's expert: teaches the task, RAGEN's SFT).
        autocast_dtype: The learner's autocast (see `StarPOConfig.training`).
    """

    env: str = "bandit"
    env_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolConfig = ProtocolConfig()
    budget: TurnBudget = TurnBudget()
    num_examples: int = 256
    answers_per_prompt: int = 1
    epochs: int = 2
    batch_size: int = 8
    lr: float = 1e-4
    seed: int = 0
    player: str = "random"
    autocast_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.player not in WARM_START_PLAYERS:
            raise ValueError(f"warm start player must be one of {WARM_START_PLAYERS}, got {self.player!r}")
        for name in ("num_examples", "answers_per_prompt", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm start {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"warm start lr must be > 0, got {self.lr}")

    @property
    def num_steps(self) -> int:
        """Optimiser steps (behaviour-cloning iterations) over all epochs."""
        trajectories = self.num_examples * (self.answers_per_prompt if self.player == "random" else 1)
        return self.epochs * -(-trajectories // self.batch_size)

    def fingerprint(self, model: str) -> str:
        """A short hash naming the cached result of warm-starting `model` with this config."""
        # The env's instructions and renders are in every demonstration's prompt: an env that words them
        # differently is a new warm start (its first state stands for the render).
        env = make_env(self.env, **self.env_config)
        texts = {"instructions": env.instructions, "first_state": env.reset(seed=self.seed)[0]}
        payload = json.dumps(
            {"model": model, "method": WARM_START_METHOD, **texts, **dataclasses.asdict(self)},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def warm_start(
    model: str, config: WarmStartConfig, *, cache_dir: str | Path | None = None, progress: bool = False
) -> Path:
    """Returns the directory of `model` warm-started with `config` (built once, then cached).

    Needs Ray (the offline data is read with Ray Data); starts it if it is not running.
    """
    base_path = resolve_model(model, cache_dir=cache_dir, progress=progress)
    builtin = BuiltinModel(
        name=f"warm-start-{config.fingerprint(str(base_path))}",
        description=f"{model} warm-started on {config.env} ({config.player} play)",
        source=f"{base_path} + format warm start {dataclasses.asdict(config)}",
        n_steps=config.num_steps,
        build=lambda out_dir, report: _train(base_path, config, out_dir, report),
    )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return prepare_builtin(builtin, models_dir=root / "models", progress=progress)


def demonstrations(tokenizer: Any, config: WarmStartConfig) -> list[MultiAgentEpisode]:
    """The warm start's data, played from `num_examples` states (seeds far from training and evaluation).

    Random play: `answers_per_prompt` trajectories from each state. The expert
    plays each state once (its answer does not vary); states it cannot play
    within the budget are skipped.
    """
    seeds = [config.seed * 1_000_003 + index for index in range(config.num_examples)]
    common: dict[str, Any] = dict(
        env=config.env, env_config=dict(config.env_config), protocol=config.protocol, budget=config.budget
    )
    if config.player == "expert":
        return expert_demonstrations(tokenizer, DemonstrationConfig(seeds=tuple(seeds), **common))
    return random_demonstrations(
        tokenizer,
        RandomPlayConfig(
            seeds=tuple(seed for seed in seeds for _ in range(config.answers_per_prompt)),
            seed=config.seed,
            **common,
        ),
    )


def behaviour_cloning_config(base_path: Path, config: WarmStartConfig) -> StarPOConfig:
    """The StarPO config whose offline BC run is the warm start (in-process HF engine, never sampled)."""
    protocol, budget = config.protocol, config.budget
    return (
        StarPOConfig()
        .environment(config.env, env_config=dict(config.env_config))
        .llm(model=str(base_path), critic="none", dtype="float32")
        .rollouts(
            n_groups=config.batch_size,
            group_size=1,
            max_turns=budget.max_turns,
            max_actions_per_turn=protocol.max_actions_per_turn,
            max_actions_per_traj=budget.max_actions_per_traj,
            format_penalty=budget.format_penalty,
            think=protocol.think,
            prefill=protocol.prefill,
            history_window=protocol.history_window,
        )
        .inference(engine="hf")
        # Behaviour cloning computes no advantages; a critic-free estimator keeps the config valid without a critic.
        .training(
            advantage_estimator="grpo",
            actor_lr=config.lr,
            mini_batch_size=config.batch_size,
            micro_batch_size=min(4, config.batch_size),
            autocast_dtype=config.autocast_dtype,
        )
        .starpo_evaluation(eval_interval=0)
        # The collapse diagnostics and the echo-trap monitor read a policy's own samples; on fixed
        # demonstrations they would only print warnings about the demonstrations' templates.
        .diagnostics(collapse_metrics_interval=0)
        .debugging(seed=config.seed)
    )


def _train(base_path: Path, config: WarmStartConfig, out_dir: Path, report: Callable[[str], None]) -> None:
    torch.manual_seed(config.seed)
    init_ray()
    episodes = demonstrations(load_tokenizer(base_path), config)
    if not episodes:
        raise RuntimeError(f"the {config.player} player made no demonstration of {config.env} within the budget")
    with tempfile.TemporaryDirectory(prefix="warm-start-") as data_dir:
        data = Path(data_dir) / f"{config.player}_play.parquet"
        write_trajectories(episodes, data, env=config.env, env_config=config.env_config)
        bc = offline_config(behaviour_cloning_config(base_path, config), OfflineSettings(str(data), objective="bc"))
        algo = bc.build_algo()
        try:
            for step in range(config.num_steps):
                nll = algo.train()["learners"][DEFAULT_MODULE_ID]["bc_nll"]
                report(f"step {step + 1}/{config.num_steps} answer NLL {nll:.3f}")
            algo.export_policy(out_dir)
        finally:
            algo.stop()
