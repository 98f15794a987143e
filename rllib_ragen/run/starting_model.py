"""The model RL starts from: a given warm-started one, the base model, or the (cached) warm start."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig


def check_starting_model(args: argparse.Namespace) -> None:
    """Refuses contradicting warm-start flags and a `--warm-start-model` that is not a model directory."""
    if args.warm_start_model and args.no_warm_start:
        raise ValueError("--warm-start-model and --no-warm-start contradict each other; pass one")
    if args.warm_start_model:
        from rllib_ragen.models import resolve_model  # only now: it imports torch

        resolve_model(args.warm_start_model)


def choose_starting_model(
    config: StarPOConfig, args: argparse.Namespace, *, tuned_warm_start: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The model RL starts from: a given warm-started one, none, or the (cached) warm start
    on the preset's player (the env's expert, or random moves that teach the format only), with a
    tuned example's choices (`tuned_warm_start`, `WarmStartSettings` fields).

    Returns:
        The run's model tags: `base_model` and `warm_start_model` ("none" without a warm start).
    """
    from rllib_ragen.models import resolve_model
    from rllib_ragen.run.warm_start import apply_warm_start

    check_starting_model(args)
    base = str(config.llm_module.model)
    if args.warm_start_model:
        config.llm(model=str(resolve_model(args.warm_start_model)))
    elif not args.no_warm_start:  # cached: a resumed run gets the same warm-started model back
        apply_warm_start(
            config,
            num_examples=args.warm_start_examples,
            player=args.warm_start_player,
            world_model_epochs=args.warm_start_world_model_epochs,
            expert_noise=args.warm_start_expert_noise,
            tuned=tuned_warm_start,
        )
    return {"base_model": base, "warm_start_model": "none" if args.no_warm_start else str(config.llm_module.model)}
