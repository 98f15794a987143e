"""Which of the project's modules one `StarPO.training_step` executes.

Builds StarPO on the tiny random model (in-process HF engine, local learner, so
that every step of an iteration runs in this process), trains one iteration to
warm up, then records, with `sys.setprofile` on every thread, each function call
of the next `algo.training_step()` whose code lives in `rllib_ragen/` or `envs/`.
Prints the package's modules one iteration touches, one a line, and their count
(how many rooms a reader walks through to follow one iteration); then, apart, the
env's own modules (`envs/`, like gymnasium's in a count of RLlib's PPO) and the
modules the fixed-seed evaluation adds when it is due (`evaluate_fixed_seeds`,
traced on its own), for information.

    python benchmarks/module_trace.py                 # Sokoban, the CPU preset's estimator
    python benchmarks/module_trace.py --env frozenlake --estimator gae
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from envs import check_env
from envs.user_errors import CLIParser, front_door, input_checks
from rllib_ragen.checks import check_choice
from rllib_ragen.training.advantages import ADVANTAGE_ESTIMATORS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rllib_ragen", "envs")


def module_of(filename: str) -> str | None:
    """`.../rllib_ragen/training/learner.py` -> "rllib_ragen.training.learner"; None outside the project."""
    path = Path(filename)
    parts = path.with_suffix("").parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in PACKAGES:
            names = [part for part in parts[index:] if part != "__init__"]
            return ".".join(names)
    return None


@contextmanager
def traced_modules() -> Iterator[set[str]]:
    """Collects the project modules whose functions are called inside the block, on every thread."""
    seen: set[str] = set()
    files: dict[str, str | None] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if filename not in files:
            files[filename] = module_of(filename)
        module = files[filename]
        if module is not None:
            seen.add(module)

    previous: Callable[..., Any] | None = sys.getprofile()
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)
        threading.setprofile(None)  # type: ignore[arg-type]  # None removes the hook


def one_iteration_modules(*, env: str, estimator: str, cache_dir: Path) -> tuple[list[str], list[str]]:
    """The sorted project modules one `training_step` of a tiny StarPO run executes (after a warm-up
    iteration), and those one fixed-seed evaluation executes."""
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.models import resolve_model

    model = resolve_model("tiny-random", cache_dir=cache_dir)
    config = (
        StarPOConfig()
        .environment(env)
        .llm(model=str(model), critic="head" if estimator in ("gae", "bi_level_gae") else "none")
        .rollouts(n_groups=2, group_size=2, max_turns=2, response_length=12)
        .inference(engine="hf")
        .training(advantage_estimator=estimator, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=0, eval_size=2)  # evaluation is traced apart, below
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        algo.train()  # first iteration: lazy imports and one-off set-up are not the iteration's data flow
        algo.evaluate_fixed_seeds()  # the same for the evaluation's first call
        with traced_modules() as iteration:
            algo.training_step()
        with traced_modules() as evaluation:
            algo.evaluate_fixed_seeds()
    finally:
        algo.stop()
    return sorted(iteration), sorted(evaluation)


def in_package(modules: list[str], package: str) -> list[str]:
    """The modules of `package` (a top-level package of the project) among `modules`."""
    return [name for name in modules if name == package or name.startswith(f"{package}.")]


@front_door
def main(argv: list[str] | None = None) -> int:
    parser = CLIParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="sokoban", help="env to train on (default: sokoban)")
    parser.add_argument("--estimator", default="grpo", help="advantage estimator (default: grpo, the CPU preset's)")
    args = parser.parse_args(argv)
    with input_checks():
        check_env(args.env)
        check_choice("estimator", args.estimator, sorted(ADVANTAGE_ESTIMATORS))
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="module_trace_") as scratch:
            iteration, evaluation = one_iteration_modules(
                env=args.env, estimator=args.estimator, cache_dir=Path(scratch)
            )
    finally:
        ray.shutdown()
    package = in_package(iteration, "rllib_ragen")
    env_modules = in_package(iteration, "envs")
    evaluation_extra = [name for name in evaluation if name not in iteration]
    print("\n".join(package))
    print(f"{len(package)} rllib_ragen modules executed by one training_step ({args.env}, {args.estimator})")
    print("\n".join(env_modules))
    print(f"{len(env_modules)} envs modules (the env's own code) executed by it")
    print("\n".join(evaluation_extra))
    print(f"{len(evaluation_extra)} more modules executed by a fixed-seed evaluation (when due; not counted above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
