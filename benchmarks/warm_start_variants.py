"""Success before RL of variants of the CPU preset's expert warm start, against its default, in one run.

For each pair of `--examples` N and `--noise` P, builds the warm start `rllib-ragen train --env ENV
--warm-start-examples N --warm-start-noise P` would start from (`warm_start_config` of the CPU preset: by default 192
expert states once on the last 10 layers; with noise P, each turn the env plays a random move with probability P
while the answer taught stays the expert's best move from the state shown, DART; built once into the model cache,
then reused), then plays it on the fixed evaluation seeds (from 123) and on held-out seeds that no tuning used (from
50000), at the preset's evaluation temperature. The first variant (the first N with the first P) is the baseline:
every other one prints its paired difference to it on the same seeds (95% intervals).

    python benchmarks/warm_start_variants.py --env sokoban --noise 0 0.25 0.5
    python benchmarks/warm_start_variants.py --env sokoban --examples 192 384 768
    python benchmarks/warm_start_variants.py --env frozenlake --noise 0 0.25 --episodes 128
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import TYPE_CHECKING

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.flags import positive_int, probability_below_one

if TYPE_CHECKING:
    from rllib_ragen.rollout.evaluation import Evaluation

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVALUATION_SEED, HELD_OUT_SEED = 123, 50_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="sokoban", help="registered env with an expert (its CPU preset is used)")
    parser.add_argument(
        "--noise",
        type=probability_below_one,
        nargs="+",
        default=[0.0],
        help="the disturbance probabilities to build; the first is the baseline's",
    )
    parser.add_argument(
        "--examples",
        type=positive_int,
        nargs="+",
        default=[192],
        help="the numbers of expert states to demonstrate; the first is the baseline's",
    )
    parser.add_argument("--episodes", type=positive_int, default=128, help="seeds of each evaluation")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="base model")
    return parser.parse_args(argv)


def evaluations_by_seed_set(model: str, env: str, episodes: int) -> dict[str, Evaluation]:
    """`model` (a model directory) played on the evaluation and on the held-out seeds."""
    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.run.evaluate import evaluate_env

    evaluations = {}
    for name, first in (("evaluation", EVALUATION_SEED), ("held out", HELD_OUT_SEED)):
        config = cpu_preset(env).llm(model=model).env_runners(num_env_runners=0)
        config.validate_starpo()
        evaluations[name] = evaluate_env(config, seeds=range(first, first + episodes))
    return evaluations


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from rllib_ragen.algorithm.presets import cpu_preset
    from rllib_ragen.intervals import format_rate, paired_difference_interval
    from rllib_ragen.run.warm_start import warm_start, warm_start_config

    results: dict[str, dict[str, Evaluation]] = {}
    for examples, noise in itertools.product(args.examples, args.noise):
        variant = f"{examples} states, noise {noise}"
        preset = cpu_preset(args.env).llm(model=args.model)
        settings = warm_start_config(preset, num_examples=examples, expert_noise=noise)
        began = time.perf_counter()
        model = warm_start(args.model, settings, progress=True)
        built = time.perf_counter() - began
        results[variant] = evaluations_by_seed_set(str(model), args.env, args.episodes)
        print(f"{variant}: warm start {model.name} ({built:.0f} s, cached or built)", flush=True)
        for name, evaluation in results[variant].items():
            failures = ", ".join(f"{kind} {count}" for kind, count in evaluation.failures.items() if count)
            print(f"  {name} seeds: success {format_rate(evaluation.successes)}; failures: {failures}", flush=True)
    baseline, *others = results
    for variant in others:
        for name, evaluation in results[variant].items():
            difference, low, high = paired_difference_interval(results[baseline][name].successes, evaluation.successes)
            print(f"{variant} - {baseline}, {name} seeds: {difference:+.3f} [{low:+.3f}, {high:+.3f}]")


if __name__ == "__main__":
    main()
