"""Smoke test of the GPU preset: `ragen_preset` on one GPU in about 10 minutes (`scripts/gpu_smoke.sh`).

Steps, each a check that ends the run with exit code 1 when it fails:
1. build the preset, sized for one GPU (engine and learner share it; the engine
   takes `--gpu-memory-utilization` of its memory) or, with `--cpu-tiny`, for CPU
   with the tiny random model (the same steps, to test this script's logic);
2. train `--iters` iterations: each must generate tokens, give finite losses and a
   weight sync after which the engines score the probe like the learner, up to
   the engine dtype's rounding (`--max-logp-gap`);
3. the sync end to end with a change it must carry: the learner's tied embedding
   (also the LM head) is doubled, which the engines must not show before a sync
   and must show after it; then it is halved back;
4. print the weight-sync time, tokens/s and the last iteration's breakdown;
5. checkpoint, restore into a new algorithm, train one more iteration, export the
   policy and load it back.

    python -m rllib_ragen.run.gpu_smoke                 # on a machine with one GPU
    python -m rllib_ragen.run.gpu_smoke --cpu-tiny      # CPU, tiny model: the same steps in ~2 minutes
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from envs.user_errors import CLIParser, UserError, front_door, input_checks
from rllib_ragen.algorithm.presets import ragen_preset
from rllib_ragen.algorithm.starpo import StarPO, StarPOConfig
from rllib_ragen.inference.engine_settings import WEIGHT_SYNC_KINDS
from rllib_ragen.models import load_causal_lm
from rllib_ragen.rllib_private import local_learner
from rllib_ragen.run.checkpoints import save_checkpoint
from rllib_ragen.run.ray_session import init_ray


class SmokeFailure(RuntimeError):
    """A check of the smoke test did not hold."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-tiny", action="store_true", help="CPU and the tiny random model (tests this script)")
    parser.add_argument("--env", default="sokoban", help="registered env")
    parser.add_argument("--model", help="model to train (default: the preset's, or tiny-random with --cpu-tiny)")
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm", help="rollout engine")
    parser.add_argument(
        "--weight-sync",
        choices=WEIGHT_SYNC_KINDS,
        default="object_store",
        help="the preset's object_store, or collective (NCCL: the learner needs a GPU of its own)",
    )
    parser.add_argument("--iters", type=int, default=2, help="iterations before the checkpoint")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.3,
        help="the engine's share of the GPU (the learner uses the rest)",
    )
    parser.add_argument(
        "--max-logp-gap",
        type=float,
        default=0.5,
        help="largest engine-vs-learner log-prob difference on the probe after a sync (a bf16 "
        "engine's rounding alone: 0.14 with SmolLM2-135M)",
    )
    return parser.parse_args(argv)


def on_one_gpu(config: StarPOConfig, *, gpu_memory_utilization: float) -> StarPOConfig:
    """The preset with its engine and local learner on one GPU: vLLM sizes itself to its share."""
    return config.inference(kv_cache_gb=None, gpu_memory_utilization=gpu_memory_utilization)


def on_cpu_tiny(config: StarPOConfig, *, model: str, engine: str) -> StarPOConfig:
    """The preset with only the model size, the device and RAGEN's budgets changed.

    The device: engine and learner on CPU, with the small KV cache and single
    thread the tiny model needs there. RAGEN's 8 x 16 groups, 5 turns x 5 actions
    (10 a trajectory), 400-token answers, 3600 positions, mini-batches of 32 and
    evaluations of 256 seeds become a few of each.
    """
    config.llm(model=model)
    config.inference(engine=engine, num_gpus_per_engine=0.0, kv_cache_gb=0.05, engine_threads=1, num_cpus_per_engine=0)
    config.learners(num_gpus_per_learner=0)
    config.rollouts(
        n_groups=4, group_size=2, max_turns=2, max_actions_per_turn=2, max_actions_per_traj=4, response_length=16
    )
    config.inference(max_model_len=1024)
    config.training(mini_batch_size=2, micro_batch_size=2)
    return config.starpo_evaluation(eval_size=2)


def check_iteration(result: dict, *, max_logp_gap: float) -> None:
    """Raises SmokeFailure unless the iteration generated tokens, trained finitely and synced right."""
    runners, learner = result["env_runners"], result["learners"][DEFAULT_MODULE_ID]
    if not runners["rollout_tokens_per_s"] > 0:
        raise SmokeFailure(f"iteration {result['training_iteration']} generated no tokens")
    losses = {key: float(learner[key]) for key in ("policy_loss", "vf_loss", "entropy") if key in learner}
    if not all(math.isfinite(value) for value in losses.values()):
        raise SmokeFailure(f"iteration {result['training_iteration']}: non-finite losses {losses}")
    gap = float(result["weight_sync"]["engine_logp_max_abs_diff"])
    if not gap <= max_logp_gap:  # NaN fails too
        raise SmokeFailure(
            f"iteration {result['training_iteration']}: after the weight sync the engines' log-probs differ from "
            f"the learner's by {gap:.4f} (> --max-logp-gap {max_logp_gap}): stale or corrupted engine weights"
        )


def check_sync_carries_a_change(algo: StarPO) -> None:
    """Doubles the learner's tied embedding: engines must differ before the sync and follow after it.

    Doubling and halving are exact, so the weights end as they started. The
    tied embedding is also the LM head, whose refresh a weight reload can miss.
    """
    embedding = local_learner(algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped().policy.get_input_embeddings()
    synced = algo.weight_sync.check()
    with torch.no_grad():
        embedding.weight.mul_(2.0)
    stale = algo.weight_sync.check()
    algo.sync_engine_weights()
    followed = algo.weight_sync.check()
    with torch.no_grad():
        embedding.weight.mul_(0.5)
    algo.sync_engine_weights()
    print(
        f"weight sync end to end: probe gap {synced:.4f} synced, {stale:.4f} with the learner's embedding "
        f"doubled and not yet synced, {followed:.4f} after its sync"
    )
    if not followed * 10 < stale:
        raise SmokeFailure(
            "the engines did not follow a doubled tied embedding through the weight sync: probe gap "
            f"{stale:.4f} before the sync, {followed:.4f} after (want at least 10x less after)"
        )


def breakdown(result: dict, rollout_timing: dict[str, float] | None) -> dict[str, float]:
    """Seconds of an iteration's phases, from its own results (RLlib's timers are smoothed over iterations).

    The smoke test trains without evaluation, so the rest of the iteration is the
    learner's: the StarPO-S filter, the learner connector and update, the metrics.
    """
    total, rollout = float(result["time_this_iter_s"]), float(result["env_runners"]["rollout_time_s"])
    phases = {"rollout": rollout}
    if rollout_timing:  # the local runner's split of the rollout
        parts = {"engine_s": "generation (engine)", "env_step_s": "env stepping", "prompt_build_s": "prompt building"}
        phases.update({f"  {name}": rollout_timing[key] for key, name in parts.items()})
        phases["  rollout, other"] = rollout - sum(rollout_timing[key] for key in parts)
    phases["weight sync"] = float(result["weight_sync"]["seconds"])
    phases["learner update and the rest"] = total - rollout - phases["weight sync"]
    phases["total"] = total
    return phases


def report(result: dict, phases: dict[str, float]) -> None:
    sync = result["weight_sync"]
    print(
        f"weight sync: {sync['seconds']:.2f} s for {sync['megabytes']:.0f} MB; "
        f"engine-vs-learner log-prob gap {sync['engine_logp_max_abs_diff']:.4f}"
    )
    print(f"rollout: {result['env_runners']['rollout_tokens_per_s']:.0f} generated tokens/s")
    print(f"iteration {result['training_iteration']} breakdown:")
    for name, seconds in phases.items():
        print(f"  {name:<30} {seconds:8.2f} s {100 * seconds / phases['total']:6.1f} %")


def run(config: StarPOConfig, *, iters: int, max_logp_gap: float, workdir: Path) -> None:
    """Trains, checks, reports, checkpoints, resumes and exports; raises SmokeFailure on a failed check."""
    algo = config.build_algo()
    try:
        for _ in range(iters):
            result = algo.train()
            check_iteration(result, max_logp_gap=max_logp_gap)
            print(
                f"iteration {result['training_iteration']}: {result['time_this_iter_s']:.1f} s, "
                f"success {result['env_runners']['success_rate']:.3f}",
                flush=True,
            )
        check_sync_carries_a_change(algo)
        timing = algo.env_runner.last_rollout_timing if algo.env_runner is not None else None
        report(result, breakdown(result, timing))
        checkpoint = save_checkpoint(algo, workdir / "checkpoints", tracking={})
    finally:
        algo.stop()
    restored = StarPO.from_checkpoint(str(checkpoint))
    try:
        if restored.iteration != iters:
            raise SmokeFailure(f"restored at iteration {restored.iteration}, saved at {iters}")
        check_iteration(restored.train(), max_logp_gap=max_logp_gap)
        load_causal_lm(restored.export_policy(workdir / "policy"))
    finally:
        restored.stop()
    print(f"checkpoint, resume at iteration {iters}, one more iteration and the export: ok")


@front_door
def main(argv: list[str] | None = None) -> int:
    """Exit status 0 (passed) or 1 (a check failed); bad input and no GPU: one `error:` line, exit code 2."""
    args = parse_args(argv)
    if not args.cpu_tiny and not torch.cuda.is_available():
        raise UserError("gpu_smoke: no CUDA GPU visible (use --cpu-tiny to test the script on CPU)")
    with input_checks():
        # Evaluation is the preset's, but would blur the breakdown of the timed iterations.
        config = ragen_preset(args.env).starpo_evaluation(eval_interval=0).inference(weight_sync=args.weight_sync)
        if args.cpu_tiny:
            config = on_cpu_tiny(config, model=args.model or "tiny-random", engine=args.engine)
        else:
            config = on_one_gpu(
                config.inference(engine=args.engine), gpu_memory_utilization=args.gpu_memory_utilization
            )
            if args.model:
                config.llm(model=args.model)
    try:
        init_ray()
        with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as workdir:
            run(config, iters=args.iters, max_logp_gap=args.max_logp_gap, workdir=Path(workdir))
    except Exception as error:  # any failure is the smoke test's answer: say what, exit non-zero
        print(f"gpu_smoke: FAILED: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print("gpu_smoke: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
