"""Does the CPU default learn? Zero-shot vs format warm start vs warm start + StarPO, per env, on this machine.

For each env (CPU preset: SmolLM2-135M-Instruct, vLLM on CPU when installed):

1. zero-shot: the base model on the fixed evaluation seeds;
2. warm start only: the format-warm-started model (random valid actions,
   behaviour-cloned; cached after the first build) on the same seeds;
3. warm start + StarPO: StarPO from the warm start for at most `--minutes`
   (and `--max-iters`), evaluated on the same seeds after every iteration.

The Bandit is also evaluated on its held-out arm names (`bandit_test`) before
and after RL. Prints a Markdown table (valid-answer ratio = answers in the
`<answer>` format; success; time) and writes it to `--output`.

    python benchmarks/cpu_learning.py                      # bandit, frozenlake, sokoban
    python benchmarks/cpu_learning.py --envs bandit --minutes 30
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rllib_ragen.algorithm import StarPOConfig  # noqa: E402
from rllib_ragen.experiment import apply_warm_start  # noqa: E402
from rllib_ragen.presets import cpu_preset  # noqa: E402
from rllib_ragen.ray_session import init_ray  # noqa: E402

HELD_OUT = {"bandit": "bandit_test"}


@dataclasses.dataclass
class Row:
    env: str
    stage: str
    well_formed: float
    success: float
    minutes: float
    iterations: int = 0

    def markdown(self) -> str:
        iters = str(self.iterations) if self.iterations else ""
        return (f"| {self.env} | {self.stage} | {self.well_formed:.2f} | {self.success:.3f} | "
                f"{self.minutes:.1f} | {iters} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--envs", default="bandit,frozenlake,sokoban", help="comma-separated registered envs")
    parser.add_argument("--minutes", type=float, default=30.0, help="StarPO time budget per env")
    parser.add_argument("--max-iters", type=int, default=200, help="StarPO iteration cap per env")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto", help="rollout engine")
    parser.add_argument("--warm-start-examples", type=int, default=16,
                        help="initial states in the format warm start (2 random trajectories each)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a StarPOConfig attribute for every env (repeatable)")
    parser.add_argument("--output", default="benchmarks/results/cpu_learning.md", help="where the table is written")
    return parser.parse_args(argv)


def env_config(env: str, args: argparse.Namespace) -> StarPOConfig:
    from rllib_ragen.experiment import apply_setting

    config = cpu_preset(env)
    config.inference(engine=args.engine)
    for assignment in args.set:
        apply_setting(config, assignment)
    return config


def evaluate(config: StarPOConfig, *, env: str | None = None) -> dict[str, float]:
    """Evaluation of `config`'s model on its fixed seeds (of `env`, if given), in a fresh algorithm."""
    config = config.copy(copy_frozen=False)
    if env is not None:
        config.environment(env)
    algo = config.build_algo()
    try:
        return algo.evaluate_fixed_seeds()
    finally:
        algo.stop()


def row(env: str, stage: str, stats: dict[str, float], seconds: float, iterations: int = 0) -> Row:
    return Row(env, stage, stats["well_formed_ratio"], stats["success_rate"], seconds / 60, iterations)


def benchmark_env(env: str, args: argparse.Namespace) -> list[Row]:
    config = env_config(env, args)
    started = time.perf_counter()
    rows = [row(env, "zero-shot", evaluate(config), 0.0)]
    print(rows[-1].markdown(), flush=True)
    began = time.perf_counter()
    apply_warm_start(config, num_examples=args.warm_start_examples)
    warm_seconds = time.perf_counter() - began
    held_out = HELD_OUT.get(env)
    if held_out:
        rows.append(row(held_out, "warm start only (held-out names)", evaluate(config, env=held_out), warm_seconds))
        print(rows[-1].markdown(), flush=True)
    algo = config.build_algo()
    try:
        before = algo.evaluate_fixed_seeds()
        rows.append(row(env, "warm start only", before, warm_seconds))
        print(rows[-1].markdown(), flush=True)
        evaluation, began = {}, time.perf_counter()
        while algo.iteration < args.max_iters and time.perf_counter() - began < args.minutes * 60:
            result = algo.train()
            evaluation = result.get("evaluation", {})
            print(f"  {env} iter {algo.iteration}: train success {result['env_runners']['success_rate']:.3f} | "
                  f"eval success {evaluation.get('success_rate', float('nan')):.3f} | "
                  f"{(time.perf_counter() - began) / 60:.1f} min", flush=True)
        trained = evaluation if "success_rate" in evaluation else algo.evaluate_fixed_seeds()
        rows.append(row(env, "warm start + StarPO", trained, time.perf_counter() - began, algo.iteration))
        print(rows[-1].markdown(), flush=True)
        policy = algo.export_policy(Path(tempfile.mkdtemp(prefix=f"{env}-starpo-")))
    finally:
        algo.stop()
    if held_out:
        config.llm(model=str(policy))
        rows.append(row(held_out, "warm start + StarPO (held-out names)", evaluate(config, env=held_out),
                        rows[-1].minutes * 60, rows[-1].iterations))
        print(rows[-1].markdown(), flush=True)
    print(f"{env}: {(time.perf_counter() - started) / 60:.1f} min in all", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    init_ray()
    header = ("| env | stage | valid-answer ratio | success | minutes | RL iterations |\n"
              "|---|---|---|---|---|---|")
    rows = []
    for env in args.envs.split(","):
        rows.extend(benchmark_env(env.strip(), args))
    table = "\n".join([header, *(r.markdown() for r in rows)])
    print("\n" + table)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(f"`python benchmarks/cpu_learning.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
                      f"{table}\n")
    print(f"table written to {output}")
    return rows


if __name__ == "__main__":
    main()
