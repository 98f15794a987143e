"""Supervised warm starts: the answer format (random play), or the task itself (an expert's play).

Small models (SmolLM2-135M, and of course a random tiny model) almost never
write `<think>...</think><answer>...</answer>` zero-shot, so RL sees no reward
signal at all. The warm start plays the env with a random player
(`rllib_ragen.data.demonstrations.random_demonstrations`: multi-turn, 1..k valid
actions per turn drawn uniformly at random, never a solver's choice) and
behaviour-clones those trajectories in a plain supervised loop
(`rllib_ragen.training.behaviour_cloning`: the learner's token scoring, loss
aggregation, optimiser and micro-batching, the rows' shared prompt prefix run
once, and no RLlib iteration, Ray Data pass or engine around each step; RLlib's
offline API stays for offline StarPO and for BC on a dataset,
`rllib_ragen.algorithm.offline_training`). Afterwards the model follows the format while its
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs import make_env
from envs.textarena_two_player import SEATS, TwoPlayerConfig, TwoPlayerGame
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.data.demonstrations import (
    DemonstrationSettings,
    RandomPlaySettings,
    expert_demonstrations,
    group_and_protocol,
    random_demonstrations,
)
from rllib_ragen.data.experts import WARM_START_PLAYERS, has_expert, warm_start_states
from rllib_ragen.data.game_demonstrations import expert_game_demonstrations, has_game_expert
from rllib_ragen.data.world_model import transition_trajectories
from rllib_ragen.models import (
    BuiltinModel,
    default_cache_dir,
    load_causal_lm,
    load_tokenizer,
    prepare_builtin,
    resolve_model,
)
from rllib_ragen.rollout.env_group import TurnBudgetSettings
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.trajectory_record import trajectories_from_episodes
from rllib_ragen.training.behaviour_cloning import (
    SupervisedSettings,
    cloning_passes,
    supervised_step,
)
from rllib_ragen.training.learner import release_freed_memory
from rllib_ragen.training.token_tree import use_tree_attention
from rllib_ragen.training.top_layers import train_top_layers_only

# Part of the cache key: a change to how the warm start trains, or to the text of the
# demonstrations it trains on (e.g. an expert's thought), must bump it so old results are not reused.
WARM_START_METHOD = "bc-8"
# The first demonstration seed: far above the evaluation (123..), held-out (50_000..) and training
# (10_000..) seeds, so a warm start of any size never plays a state it is later scored on.
DEMONSTRATION_SEED_START = 1_000_000
# Decoder layers an expert warm start trains (the last ones; see `warm_start_config`).
EXPERT_TRAINED_TOP_LAYERS = 10


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
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
        batch_size: Trajectories per pass, and token rows per optimiser step
            (a pass of 8 one-move-a-turn trajectories is up to 8 x turns rows).
        lr: AdamW learning rate.
        seed: Seeds the env instances, the random actions and the model.
        player: "random" (valid actions at random: teaches the format only)
            or "expert" (the env's expert: teaches the task, RAGEN's SFT).
        autocast_dtype: The learner's autocast (see `StarPOConfig.training`).
        trained_top_layers: None trains every weight; N trains only the last N
            decoder layers (and the final norm), the embeddings and the rest
            staying the base model's: the answers are learnt near where they
            are read out, and the layers below run forward only.
        first_seed: The first env seed played (then `seed` x 1,000,003 on);
            the default keeps the demonstrations apart from every scored seed.
        world_model_epochs: Passes over the demonstrations' transitions before
            their answers are cloned: the model learns to write the state the env
            returns after a turn's moves (`rllib_ragen.data.world_model`, SPA's
            world-model stage). 0 skips it.
        game: A two-player game whose both seats the expert plays, on self-play's
            own prompts (`rllib_ragen.data.game_demonstrations`): `num_examples`
            games, two trajectories each. None plays `env`'s single seat.
        game_opening_moves: The expert's games open with 0 to this many random
            listed moves; None: as `game`'s training games open. A deterministic
            expert's games differ only by their openings, while RL may train from
            the empty board (`StarPOConfig.self_play(training_opening_moves=...)`).
        expert_noise: With the expert player: the probability that a turn's
            moves are replaced by random ones when the env is stepped, while the
            answer taught stays the expert's best move from the state shown (DART,
            `rllib_ragen.data.disturbed_expert`): the demonstrations then also
            show the way back from the states a policy that errs reaches. Needs a
            prompt of the current state only and no world-model stage. 0: the
            expert's own play.
    """

    env: str = "bandit"
    env_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolSettings = ProtocolSettings()
    budget: TurnBudgetSettings = TurnBudgetSettings()
    num_examples: int = 256
    answers_per_prompt: int = 1
    epochs: int = 2
    batch_size: int = 8
    lr: float = 1e-4
    seed: int = 0
    player: str = "random"
    autocast_dtype: str | None = None
    trained_top_layers: int | None = None
    first_seed: int = DEMONSTRATION_SEED_START
    world_model_epochs: int = 0
    game: TwoPlayerConfig | None = None
    game_opening_moves: int | None = None
    expert_noise: float = 0.0

    def __post_init__(self) -> None:
        if self.player not in WARM_START_PLAYERS:
            raise ValueError(f"warm start player must be one of {WARM_START_PLAYERS}, got {self.player!r}")
        for name in ("num_examples", "answers_per_prompt", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm start {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"warm start lr must be > 0, got {self.lr}")
        if self.world_model_epochs < 0:
            raise ValueError(f"warm start world_model_epochs must be >= 0, got {self.world_model_epochs}")
        if self.first_seed < 0:
            raise ValueError(f"warm start first_seed must be >= 0, got {self.first_seed}")
        if self.game_opening_moves is not None and self.game_opening_moves < 0:
            raise ValueError(f"warm start game_opening_moves must be >= 0 or None, got {self.game_opening_moves}")
        if self.trained_top_layers is not None and self.trained_top_layers < 1:
            raise ValueError(f"warm start trained_top_layers must be >= 1 or None, got {self.trained_top_layers}")
        if self.expert_noise and (self.player != "expert" or self.world_model_epochs or self.game is not None):
            raise ValueError(
                f"warm start expert_noise {self.expert_noise} disturbs the expert's play of a one-seat env: it needs "
                f"player 'expert' (got {self.player!r}), no world-model stage (its targets would be states the "
                f"answers did not lead to; got world_model_epochs {self.world_model_epochs}) and no game"
            )
        if self.game is not None and (self.player != "expert" or self.world_model_epochs):
            raise ValueError(
                f"a two-player game's warm start takes the expert player and no world-model stage, got player "
                f"{self.player!r} and world_model_epochs {self.world_model_epochs}"
            )

    @property
    def expert_game(self) -> TwoPlayerConfig | None:
        """The two-player game the expert plays (`game` with the warm start's own openings), or None."""
        if self.game is None or self.game_opening_moves is None:
            return self.game
        return dataclasses.replace(self.game, max_opening_moves=self.game_opening_moves)

    @property
    def num_steps(self) -> int:
        """Optimiser steps (behaviour-cloning iterations) over all epochs."""
        per_example = self.answers_per_prompt if self.player == "random" else (1 if self.game is None else len(SEATS))
        trajectories = self.num_examples * per_example
        return (self.epochs + self.world_model_epochs) * -(-trajectories // self.batch_size)

    def fingerprint(self, model: str) -> str:
        """A short hash naming the cached result of warm-starting `model` with this config."""
        # The env's instructions and renders are in every demonstration's prompt: an env that words them
        # differently is a new warm start (its first state stands for the render).
        env = make_env(self.env, **self.env_config)
        texts: dict[str, Any] = {"instructions": env.instructions, "first_state": env.reset(seed=self.seed)[0]}
        expert_game = self.expert_game
        if expert_game is not None:  # the game's seats are prompted as self-play prompts them
            game = TwoPlayerGame(expert_game)
            texts = {"instructions": [game.instructions(seat) for seat in SEATS], "first_state": game.reset(seed=0)[0]}
        # The games played are what counts: openings set here or by the training games are one warm start.
        fields = dataclasses.asdict(dataclasses.replace(self, game=expert_game))
        del fields["game_opening_moves"]
        for field in ("world_model_epochs", "game", "expert_noise"):  # without them a cached result is kept
            if not fields[field]:
                del fields[field]
        payload = json.dumps(
            {"model": model, "method": WARM_START_METHOD, **texts, **fields},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def warm_start(
    model: str, config: WarmStartSettings, *, cache_dir: str | Path | None = None, progress: bool = False
) -> Path:
    """Returns the directory of `model` warm-started with `config` (built once, then cached).

    Runs in this process: no Ray, no engine (the supervised loop of `_train`).
    """
    base_path = resolve_model(model, cache_dir=cache_dir, progress=progress)
    builtin = BuiltinModel(
        name=f"warm-start-{config.fingerprint(str(base_path))}",
        description=f"{model} warm-started on {config.env} ({config.player} play)",
        source=f"{base_path} + {config.player}-play warm start {dataclasses.asdict(config)}",
        n_steps=config.num_steps,
        build=lambda out_dir, report: _train(base_path, config, out_dir, report),
    )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = prepare_builtin(builtin, models_dir=root / "models", progress=progress)
    # The supervised loop's activations, freed but kept by the allocator, before the learner is built.
    release_freed_memory()
    return path


def demonstration_seeds(config: WarmStartSettings) -> list[int]:
    """The `num_examples` env seeds the warm start plays, from `first_seed` (per `seed`)."""
    first = config.first_seed + config.seed * 1_000_003
    return list(range(first, first + config.num_examples))


def demonstrations(tokenizer: Any, config: WarmStartSettings) -> list[MultiAgentEpisode]:
    """The warm start's data, played from `num_examples` states (seeds far from training and evaluation).

    Random play: `answers_per_prompt` trajectories from each state. The expert
    plays each state once (its answer does not vary); states it cannot play
    within the budget are skipped.
    """
    seeds = demonstration_seeds(config)
    common: dict[str, Any] = dict(
        env=config.env, env_config=dict(config.env_config), protocol=config.protocol, budget=config.budget
    )
    game = config.expert_game
    if game is not None:
        return expert_game_demonstrations(tokenizer, game, config.protocol, seeds)
    if config.player == "expert":
        return expert_demonstrations(
            tokenizer,
            DemonstrationSettings(seeds=tuple(seeds), noise=config.expert_noise, seed=config.seed, **common),
        )
    return random_demonstrations(
        tokenizer,
        RandomPlaySettings(
            seeds=tuple(seed for seed in seeds for _ in range(config.answers_per_prompt)),
            seed=config.seed,
            **common,
        ),
    )


def _train(base_path: Path, config: WarmStartSettings, out_dir: Path, report: Callable[[str], None]) -> None:
    """Behaviour-clones the demonstrations into `base_path`'s model and writes it to `out_dir`.

    A plain supervised loop (`rllib_ragen.training.behaviour_cloning`): each of the
    `num_steps` passes takes `batch_size` trajectories and steps the optimiser once per
    `batch_size` of their token rows, as the RLlib offline iteration of the earlier
    warm start did, at the learner's own speed. With `world_model_epochs`, passes over
    the demonstrations' transitions come first (`world_model_passes`).
    """
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(base_path)
    episodes = demonstrations(tokenizer, config)
    if not episodes:
        raise RuntimeError(f"the {config.player} player made no demonstration of {config.env} within the budget")
    trajectories = trajectories_from_episodes(episodes, history_window=config.protocol.history_window)
    policy = load_causal_lm(base_path, dtype=torch.float32)
    use_tree_attention(policy)
    policy.train()
    if config.trained_top_layers is not None:
        train_top_layers_only(policy, config.trained_top_layers)
    settings = SupervisedSettings(lr=config.lr, rows_per_step=config.batch_size, autocast_dtype=config.autocast_dtype)
    optimizer = settings.optimizer(policy)
    passes = cloning_passes(
        trajectories, trajectories_per_pass=config.batch_size, rows_per_step=config.batch_size, epochs=config.epochs
    )
    stages = [("answer", passes)]
    if config.world_model_epochs:
        stages.insert(0, ("next-state", world_model_passes(tokenizer, episodes, config, len(trajectories))))
    step = 0
    for target, stage_passes in stages:
        for mini_batches in stage_passes:
            nlls = [supervised_step(policy, optimizer, rows, settings) for rows in mini_batches]
            step += 1
            report(f"step {step}/{config.num_steps} {target} NLL {sum(nlls) / len(nlls):.3f}")
    policy.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def world_model_passes(
    tokenizer: Any, episodes: list[MultiAgentEpisode], config: WarmStartSettings, num_trajectories: int
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """The world-model stage's passes: every transition of `episodes` (`transition_trajectories`)
    `world_model_epochs` times, spread over as many passes an epoch as the answers take, each
    stepping the optimiser once per `batch_size` transitions."""
    _, protocol = group_and_protocol(tokenizer, config.env, dict(config.env_config), config.protocol, config.budget)
    transitions = transition_trajectories(episodes, protocol)
    if not transitions:
        raise RuntimeError(f"the {config.player} player's demonstrations of {config.env} hold no move to learn from")
    passes_per_epoch = -(-num_trajectories // config.batch_size)
    return cloning_passes(
        transitions,
        trajectories_per_pass=-(-len(transitions) // passes_per_epoch),
        rows_per_step=config.batch_size,
        epochs=config.world_model_epochs,
    )


def warm_start_config(
    config: StarPOConfig,
    *,
    num_examples: int | None = None,
    player: str | None = None,
    world_model_epochs: int = 0,
    expert_noise: float | None = None,
    tuned: Mapping[str, Any] | None = None,
) -> WarmStartSettings:
    """The warm start of `config`: its env, prompt and turn budget, and this policy's player, states and
    learning rate; then a tuned example's choices (`tuned`: `WarmStartSettings` fields, used when the player
    is theirs), then the flags (`player`, `num_examples`, `world_model_epochs`, `expert_noise`; None:
    not given).

    `player` None: the tuned example's, else the expert where the env has one (a policy that already
    solves part of the task: RL gains most there, see docs/results/multiturn_learning_2026-11.md), else
    random play (the answer format only).
    """
    tuned = dict(tuned or {})
    if player is not None and tuned.get("player", player) != player:
        tuned = {}  # the example's states and step size are its player's
    player = player or tuned.get("player") or ("expert" if has_expert(config.env) else "random")
    tiny = config.llm_module.model == "tiny-random"
    expert = player == "expert"
    self_play = config.two_player
    # Self-play's expert plays both seats on self-play's prompts where the game has such an expert.
    game_expert = expert and self_play.enabled and has_game_expert(str(self_play.self_play_game))
    derived = WarmStartSettings(
        env=config.env,
        env_config=dict(config.env_config),
        protocol=config.protocol,
        budget=config.turn_budget,
        num_examples=warm_start_states(player, config.env),
        answers_per_prompt=2,
        # The expert's many states once each (warm_start_states); random play's few twice.
        epochs=1 if expert else 2,
        batch_size=8,
        # A random tiny model needs large steps to learn the format in a test's few steps.
        lr=3e-3 if tiny else (3e-4 if expert else 1e-4),
        player=player,
        autocast_dtype=config.scoring.autocast_dtype,
        # The expert's start trains SmolLM2's last layers only, faster and at a lower answer NLL than every
        # weight (docs/results/warm_start_speed.md); a model of that many layers or fewer trains every weight.
        trained_top_layers=EXPERT_TRAINED_TOP_LAYERS if expert else None,
        game=self_play.game_config(training=True) if game_expert and not world_model_epochs else None,
    )
    if tiny:
        tuned.pop("lr", None)  # the tiny model's step size is the tests', whatever the example tunes
    flags: dict[str, Any] = {"num_examples": num_examples} if num_examples else {}
    if expert_noise is not None:
        flags["expert_noise"] = expert_noise
    return dataclasses.replace(derived, **{**tuned, **flags, "world_model_epochs": world_model_epochs})


def apply_warm_start(
    config: StarPOConfig,
    *,
    num_examples: int | None = None,
    player: str | None = None,
    world_model_epochs: int = 0,
    expert_noise: float | None = None,
    tuned: Mapping[str, Any] | None = None,
) -> None:
    """Replaces `config`'s model by its warm-started copy (`warm_start_config`; built once, cached)."""
    ws = warm_start_config(
        config,
        num_examples=num_examples,
        player=player,
        world_model_epochs=world_model_epochs,
        expert_noise=expert_noise,
        tuned=tuned,
    )
    print(
        f"{ws.player}-play warm start of {config.llm_module.model} on {config.env} ({ws.num_examples} states"
        + (f", {world_model_epochs} world-model epoch(s) first" if world_model_epochs else "")
        + (f", the env disturbed on {ws.expert_noise:.0%} of the turns" if ws.expert_noise else "")
        + "; cached after the first run)",
        flush=True,
    )
    config.llm(model=str(warm_start(config.llm_module.model, ws, progress=True)))
