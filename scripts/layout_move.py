"""Moves rllib_ragen's modules into one package per pipeline stage (git mv), then rewrites every import.

Run once from the repository root: python scripts/layout_move.py (no arguments; --help prints this).
"""
import pathlib
import re
import subprocess
import sys

MOVES = {
    # algorithm: the RLlib Algorithm, its config and presets
    "rllib_ragen/algorithm/starpo.py": "rllib_ragen/algorithm/starpo.py",
    "rllib_ragen/algorithm/settings.py": "rllib_ragen/algorithm/settings.py",
    "rllib_ragen/algorithm/presets.py": "rllib_ragen/algorithm/presets.py",
    # rollout: env runner, groups, prompt protocol
    "rllib_ragen/rollout/env_runner.py": "rllib_ragen/rollout/env_runner.py",
    "rllib_ragen/rollout/env_group.py": "rllib_ragen/rollout/env_group.py",
    "rllib_ragen/rollout/async_rollouts.py": "rllib_ragen/rollout/async_rollouts.py",
    "rllib_ragen/rollout/evaluation.py": "rllib_ragen/rollout/evaluation.py",
    "rllib_ragen/rollout/reward_shaping.py": "rllib_ragen/rollout/reward_shaping.py",
    "rllib_ragen/rollout/prompt/answer_parser.py": "rllib_ragen/rollout/prompt/answer_parser.py",
    "rllib_ragen/rollout/prompt/chat_template.py": "rllib_ragen/rollout/prompt/chat_template.py",
    "rllib_ragen/rollout/prompt/protocol.py": "rllib_ragen/rollout/prompt/protocol.py",
    "rllib_ragen/rollout/prompt/token_history.py": "rllib_ragen/rollout/prompt/token_history.py",
    # inference: engines and weight sync
    "rllib_ragen/inference/vllm/pool.py": "rllib_ragen/inference/vllm/pool.py",
    "rllib_ragen/inference/vllm/actor.py": "rllib_ragen/inference/vllm/actor.py",
    "rllib_ragen/inference/vllm/reload.py": "rllib_ragen/inference/vllm/reload.py",
    # training: module, learner, connector pieces, advantages, losses, filters, diagnostics
    "rllib_ragen/training/module.py": "rllib_ragen/training/module.py",
    "rllib_ragen/training/learner.py": "rllib_ragen/training/learner.py",
    "rllib_ragen/training/learner_connector.py": "rllib_ragen/training/learner_connector.py",
    "rllib_ragen/training/token_batch.py": "rllib_ragen/training/token_batch.py",
    "rllib_ragen/training/advantages.py": "rllib_ragen/training/advantages.py",
    "rllib_ragen/training/losses.py": "rllib_ragen/training/losses.py",
    "rllib_ragen/training/filtering.py": "rllib_ragen/training/filtering.py",
    "rllib_ragen/training/token_masks.py": "rllib_ragen/training/token_masks.py",
    "rllib_ragen/training/off_policy.py": "rllib_ragen/training/off_policy.py",
    "rllib_ragen/training/echo_trap.py": "rllib_ragen/training/echo_trap.py",
    "rllib_ragen/training/collapse_metrics.py": "rllib_ragen/training/collapse_metrics.py",
    "rllib_ragen/training/distributed.py": "rllib_ragen/training/distributed.py",
    "rllib_ragen/training/lora.py": "rllib_ragen/training/lora.py",
    # data: trajectories on disk, offline training, warm start
    "rllib_ragen/data/offline.py": "rllib_ragen/data/offline.py",
    "rllib_ragen/data/warm_start.py": "rllib_ragen/data/warm_start.py",
    # run: drivers, evaluation CLI, tracking, sweeps, checkpoints
    "rllib_ragen/run/experiment.py": "rllib_ragen/run/experiment.py",
    "rllib_ragen/run/evaluate.py": "rllib_ragen/run/evaluate.py",
    "rllib_ragen/run/policy_evaluation.py": "rllib_ragen/run/policy_evaluation.py",
    "rllib_ragen/run/tracking.py": "rllib_ragen/run/tracking.py",
    "rllib_ragen/run/callbacks.py": "rllib_ragen/run/callbacks.py",
    "rllib_ragen/run/sweep.py": "rllib_ragen/run/sweep.py",
    "rllib_ragen/run/checkpoints.py": "rllib_ragen/run/checkpoints.py",
    "rllib_ragen/run/analysis.py": "rllib_ragen/run/analysis.py",
    "rllib_ragen/run/trajectory_page.py": "rllib_ragen/run/trajectory_page.py",
    "rllib_ragen/run/console.py": "rllib_ragen/run/console.py",
    "rllib_ragen/run/ray_session.py": "rllib_ragen/run/ray_session.py",
    "rllib_ragen/run/gpu_smoke.py": "rllib_ragen/run/gpu_smoke.py",
    "rllib_ragen/run/hardware.py": "rllib_ragen/run/hardware.py",
}
PACKAGE_DOCS = {
    "rllib_ragen/algorithm/__init__.py": "StarPO as an RLlib Algorithm: `starpo` (StarPOConfig, StarPO.training_step), its settings groups and presets.",
    "rllib_ragen/rollout/__init__.py": "Step 1 of an iteration, sampling: the LLM env runner, env groups, async rollouts, fixed-seed evaluation.",
    "rllib_ragen/rollout/prompt/__init__.py": "The prompt protocol: chat template, prompts, answer parsing, token histories (token-in/token-out).",
    "rllib_ragen/inference/__init__.py": "Rollout engines (in-process HF, vLLM actor pool) and the learner -> engine weight sync.",
    "rllib_ragen/inference/vllm/__init__.py": "vLLM engines in Ray actors: the pool, the actor, in-place weight reload.",
    "rllib_ragen/training/__init__.py": "Steps 2-4 of an iteration, the update: group filter, RL module, learner connector pieces, advantages, losses, learner.",
    "rllib_ragen/run/__init__.py": "Running experiments: driver, evaluation CLI, MLflow tracking and callbacks, sweeps, checkpoints, run pages.",
}


def module_name(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


def main() -> None:
    renames = {module_name(old): module_name(new) for old, new in MOVES.items()}
    for old, new in MOVES.items():
        pathlib.Path(new).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", old, new], check=True)
    for path, doc in PACKAGE_DOCS.items():
        if not pathlib.Path(path).exists():
            pathlib.Path(path).write_text(f'"""{doc}"""\n')
            subprocess.run(["git", "add", path], check=True)
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in sorted(renames, key=len, reverse=True)) + r")(?![\w])")
    files = subprocess.run(["git", "ls-files"], check=True, capture_output=True, text=True).stdout.split()
    suffixes = (".py", ".md", ".ipynb", ".toml", ".sh", ".yaml", ".yml", ".txt", ".cfg")
    for name in files:
        path = pathlib.Path(name)
        if not name.endswith(suffixes) or not path.is_file():
            continue
        text = path.read_text()
        new = pattern.sub(lambda m: renames[m.group(1)], text)
        # Paths in prose and commands: rllib_ragen/rollout/env_runner.py -> rllib_ragen/rollout/env_runner.py
        for old, moved in MOVES.items():
            new = re.sub(r"(?<![\w/])" + re.escape(old) + r"(?![\w])", moved, new)
        if new != text:
            path.write_text(new)
            print("rewrote", name)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(__doc__)
        sys.exit(0 if sys.argv[1] in ("-h", "--help") else 2)
    main()
