"""The tuned-example flags: the parser, and the `StarPOConfig` they build (`config_from_args`).

Only light modules are imported at the top (`--help`, and a flag, env or path error, must not
wait for Ray or torch). Flag errors are one line, `error: ...`, and exit code 2 (`CLIParser`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from envs import check_env
from envs.user_errors import CLIParser
from rllib_ragen.algorithm.presets import PRESET_CRITICS, PRESETS, preset
from rllib_ragen.data.experts import EXPERT_STATES_BY_ENV, WARM_START_PLAYERS, WARM_START_STATES
from rllib_ragen.run.settings_flag import apply_settings

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def probability_below_one(text: str) -> float:
    """An argparse type: a probability in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability >= 0 and < 1, got {text!r}")
    return value


def build_parser(
    *,
    env: str,
    description: str,
    success_threshold: float | None,
    stop_iters: int,
    job_budget_min: float | None = None,
    prog: str | None = None,
) -> argparse.ArgumentParser:
    """The flags every tuned example takes (RLlib's tuned-example style)."""
    parser = CLIParser(prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(parser, env=env, stop_iters=stop_iters)
    add_tracking_flags(parser)
    add_budget_flags(parser, job_budget_min=job_budget_min)
    add_result_flags(parser, success_threshold=success_threshold)
    add_checkpoint_flags(parser)
    add_verbose_flag(
        parser, logs="the libraries' logs and warnings (Ray, RLlib, vLLM, transformers)", to="the run's log file"
    )
    return parser


# What `--verbose` brings to the console: of a training run, and of the trials of a sweep or a study.
LIBRARY_LOGS = "the libraries' logs and warnings (Ray, RLlib, vLLM, transformers)"
TRIAL_LOGS = "the trials' output (RLlib, vLLM, Ray Tune) and the libraries' logs"


def add_verbose_flag(parser: argparse.ArgumentParser, *, logs: str, to: str) -> None:
    """`--verbose`: `logs` on the console too, which otherwise go to `to` only (read by `route_library_logs`)."""
    parser.add_argument(
        "--verbose", action="store_true", help=f"show {logs} on the console too; by default they go to {to} only"
    )


def add_budget_flags(parser: argparse.ArgumentParser, *, job_budget_min: float | None) -> None:
    """The time budgets of training and of the whole job (read by `training_budget_s`)."""
    parser.add_argument(
        "--time-budget-min",
        type=positive_float,
        help="training time budget: the iteration expected to cross it is the last (it evaluates "
        "and checkpoints); --stop-iters still applies",
    )
    parser.add_argument(
        "--job-budget-min",
        type=positive_float,
        help="the whole job's time budget, from its start (warm start, evaluations, training): "
        "training gets what the warm start and the first evaluation leave of it (default: "
        f"{job_budget_min} unless --time-budget-min is given)",
    )


def add_result_flags(parser: argparse.ArgumentParser, *, success_threshold: float | None) -> None:
    """What the run reports at its end: the summary file and the `--as-test` check."""
    parser.add_argument(
        "--summary-json",
        metavar="PATH",
        help="write the before/after evaluation (per-seed outcomes and intervals) as JSON",
    )
    parser.add_argument("--as-test", action="store_true", help="exit 1 unless the success threshold is reached")
    parser.add_argument(
        "--success-threshold",
        type=float,
        default=success_threshold,
        help="success rate --as-test requires (evaluation's if evaluated, else training's); the env's "
        "tuned threshold, set from measured runs, where it has one",
    )


# A checkpoint holds the policy and its AdamW state: written every iteration it took a large share of the
# RL time (docs/results/checkpoint_sizes.md, tuned_example_runs.md). Every 5th bounds what a crash loses to
# 5 iterations (and MLflow's lag, see docs/fault_tolerance.md).
CHECKPOINT_EVERY = 5


def add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    """Where checkpoints go, how often, how many are kept, and resuming from them."""
    parser.add_argument(
        "--checkpoint-dir",
        help="where checkpoints, the final policy and the run's log file go (default: ./checkpoints/<env>-starpo)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=CHECKPOINT_EVERY,
        help="save a local checkpoint every N iterations (and at the end, or on Ctrl-C); "
        "metrics reach MLflow with the checkpoint",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=positive_int,
        default=2,
        help="local checkpoints kept: the newest N complete ones (older ones are removed)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest complete checkpoint in --checkpoint-dir, in its MLflow run",
    )


def add_config_flags(parser: argparse.ArgumentParser, *, env: str, stop_iters: int) -> None:
    """Flags that build the `StarPOConfig` (read by `config_from_args`)."""
    parser.add_argument(
        "--env",
        default=env,
        help="registered env name, or an env class as an import path module:Class (module "
        "importable from the working directory or PYTHONPATH, e.g. my_envs:GuessEnv)",
    )
    parser.add_argument(
        "--preset", choices=PRESETS, default="cpu", help="cpu: SmolLM2-135M on CPU; gpu: RAGEN's defaults"
    )
    parser.add_argument("--stop-iters", type=positive_int, default=stop_iters, help="training iterations")
    parser.add_argument("--model", help="model name, local HF dir or hub id (default: the preset's)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="rollout engine (default: the preset's)")
    parser.add_argument("--num-engines", type=positive_int, help="vLLM engine actors")
    parser.add_argument("--n-groups", type=positive_int, help="groups per iteration")
    parser.add_argument("--group-size", type=positive_int, help="trajectories per group")
    parser.add_argument("--max-turns", type=positive_int, help="turns per trajectory")
    # No argparse choices: the estimator registry imports torch; the config check names the registered ones.
    parser.add_argument("--estimator", help="advantage estimator, e.g. grpo or gae (default: the preset's)")
    parser.add_argument("--no-think", action="store_true", help="answer with <answer> only (no-think mode)")
    add_warm_start_flags(parser)
    parser.add_argument(
        "--warm-start-model",
        metavar="DIR",
        help="use this warm-started model directory (a Hugging Face directory, e.g. an earlier "
        "run's final_policy/ or a warm start's cache entry) instead of building the warm start",
    )
    parser.add_argument("--eval-size", type=positive_int, help="fixed evaluation seeds (default: the preset's)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any StarPOConfig attribute, e.g. --set actor_lr=1e-5 (repeatable; the value is "
        "converted through the type the setting declares)",
    )
    parser.add_argument("--seed", type=int, help="random seed")


def add_warm_start_flags(parser: argparse.ArgumentParser) -> None:
    """The warm start's flags: none, who plays its demonstrations, how many initial states, and a
    world-model stage before it."""
    parser.add_argument(
        "--no-warm-start",
        action="store_true",
        help="skip the supervised warm start (on the preset's player: the env's expert, or random moves)",
    )
    parser.add_argument(
        "--warm-start",
        choices=WARM_START_PLAYERS,
        dest="warm_start_player",
        help="who plays the warm start's demonstrations: random (the answer format only) or "
        "expert (the env's solver: RAGEN's SFT start); default: expert where the env has one",
    )
    parser.add_argument(
        "--warm-start-examples",
        type=positive_int,
        help="initial states played in the warm start (random play: 2 trajectories each; "
        f"default: {WARM_START_STATES['random']} for random play, "
        f"{WARM_START_STATES['expert']} for the expert, "
        + ", ".join(f"{states} on {env}" for env, states in EXPERT_STATES_BY_ENV.items())
        + ")",
    )
    parser.add_argument(
        "--warm-start-world-model",
        type=non_negative_int,
        default=0,
        dest="warm_start_world_model_epochs",
        metavar="EPOCHS",
        help="first teach the model the env's dynamics for EPOCHS passes: after each demonstrated turn, "
        "write the state the env returned (SPA's world-model stage; evaluation never shows a predicted "
        "state); default 0: no such stage",
    )
    parser.add_argument(
        "--warm-start-noise",
        type=probability_below_one,
        dest="warm_start_expert_noise",
        metavar="P",
        help="the expert's demonstrations with the env disturbed: each turn, with probability P, the env plays "
        "a random move while the answer taught stays the expert's best move from the state shown (DART), so "
        "the demonstrations also show the way back from a wrong move; needs a prompt of the current state "
        "only; default: the tuned example's, else 0",
    )


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of the MLflow tracking (read by `mlflow_settings`)."""
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI, e.g. http://127.0.0.1:5000 (default: sqlite:///./mlflow.db)"
    )
    parser.add_argument("--experiment", help="MLflow experiment name (default: rllib-ragen)")
    parser.add_argument(
        "--log-checkpoint-every",
        type=non_negative_int,
        default=0,
        help="also log a checkpoint to MLflow every N iterations and at the last one "
        "(0: never; the final policy is logged either way)",
    )


def config_from_args(args: argparse.Namespace, *, tuned: Callable[[], StarPOConfig] | None = None) -> StarPOConfig:
    """The preset for the env (or a tuned example's own config, `tuned()`, for its env on the CPU
    preset), with the flags applied and validated.

    Raises:
        ValueError, TypeError: a flag or `--set` the config refuses (the message names it).
    """
    if ":" in args.env and os.getcwd() not in sys.path:
        # `python tuned_examples/x.py` puts the script's folder on sys.path, not the working
        # directory, which is where Ray's workers look (and where a user's my_envs.py is).
        sys.path.insert(0, os.getcwd())
    check_env(args.env)  # before the preset imports Ray and torch: a typo fails at once
    config = tuned() if tuned is not None else None
    if config is None or args.preset != "cpu" or args.env != config.env:
        config = preset(args.preset, args.env)
    config.llm(model=_given(args.model, config.llm_module.model))
    config.inference(
        engine=_given(args.engine, config.rollout_engine.kind),
        num_engines=_given(args.num_engines, config.rollout_engine.num_engines),
    )
    config.rollouts(
        n_groups=_given(args.n_groups, config.rollout.n_groups),
        group_size=_given(args.group_size, config.rollout.group_size),
        max_turns=_given(args.max_turns, config.turn_budget.max_turns),
        think=False if args.no_think else config.protocol.think,
        prefill=True if args.no_think else config.protocol.prefill,
    )
    if args.estimator:
        from rllib_ragen.training.advantages import ADVANTAGE_ESTIMATORS

        config.training(advantage_estimator=args.estimator)
        if args.estimator in ADVANTAGE_ESTIMATORS:  # an unknown one is named by `validate_starpo` below
            # The module carries a critic exactly when the estimator reads one (--set critic=... picks another kind).
            config.llm(critic=_critic_for(args.estimator, config.llm_module.critic, preset=args.preset))
    if args.seed is not None:
        config.debugging(seed=args.seed)
    if args.eval_size is not None:
        config.starpo_evaluation(eval_size=args.eval_size)
    apply_settings(config, args.set)
    config.validate_starpo()
    return config


def _critic_for(estimator: str, critic: str, *, preset: str) -> str:
    """The critic for `--estimator`: none for a critic-free one; for one that reads a critic, the
    config's own, or the preset's (`PRESET_CRITICS`) where the config has none."""
    from rllib_ragen.training.advantages import needs_critic

    if not needs_critic(estimator):
        return "none"
    return PRESET_CRITICS[preset] if critic == "none" else critic


def _given(flag: Any, default: Any) -> Any:
    return default if flag is None else flag
