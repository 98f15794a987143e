"""Cost curves: how an iteration of the CPU preset grows with its work, one thing varied at a time.

Axes (each point varies one setting of `cpu_preset(--env)`, evaluation off):

- trajectories: trajectories per iteration (groups of 4): 16, 32, 64, 128, 256
- turns-markov / turns-full: turns per trajectory (one move a turn), on a Markov prompt (the current
  state only) or on the whole history: 1, 3, 5, 10. A whole-history prompt that outgrows the
  preset's max_model_len ends its trajectory there: each point counts those trajectories.
- answer: answer length in tokens, with think on: 4, 32, 128, 256
- model: SmolLM2-135M, and randomly initialised models with the shapes of SmolLM2-360M and
  Qwen2.5-0.5B (benchmarks/shaped_random_models.py; cost does not depend on the weights' values)

Each point runs in a fresh process (so its peak RSS is its own): `--iters` training iterations, the
first untimed; the figures are medians over iterations 2 onwards. Seconds per iteration split into
the rollout (the env runner's sampling), the weight sync (the new weights into the engine(s), and
their check) and the update (the rest of the iteration: filter, learner connector and update,
metrics). Each point reports the peak RSS of every process of its tree over 100 MiB (the driver,
the engine actor(s)), generation's and the update's GFLOP/s (counted as
benchmarks/iteration_breakdown.py counts them) against this machine's matmul ceiling in the dtype
the preset computes in (bf16 where it is fast, else float32), measured once before the points.
Each axis gets a least-squares line (seconds per iteration against the axis's work, with its rms
residual) and a log-log growth exponent (1 = linear); `--plot` draws every axis.

    python benchmarks/cost_curves.py --axis trajectories --iters 3 --output cost.md --plot cost.png
    python benchmarks/cost_curves.py --axis turns-full --points 1,10 --trajectories 16
    python benchmarks/cost_curves.py --from-json cost.json --output cost.md --plot cost.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.user_errors import CLIParser, UserError, front_door
from rllib_ragen.run.given_paths import output_file

if TYPE_CHECKING:
    from iteration_breakdown import PolicyParameters

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GROUP_SIZE = 4  # the CPU preset's group size; the trajectories axis varies the number of groups
REPORTED_PROCESS_MB = 100  # processes below this peak (Ray's small helpers) are left out of the report


@dataclass(frozen=True)
class Axis:
    """One varied setting: its points, how a point changes the preset, and the work a point stands for."""

    unit: str
    points: tuple[str, ...]
    apply: Callable[[Any, str], None]


def set_trajectories(config: Any, point: str) -> None:
    trajectories = int(point)
    if trajectories < GROUP_SIZE or trajectories % GROUP_SIZE:
        raise UserError(f"trajectories per iteration must be a positive multiple of {GROUP_SIZE}, got {point}")
    config.rollouts(n_groups=trajectories // GROUP_SIZE, group_size=GROUP_SIZE)
    config.inference(max_batch_size=trajectories)  # each turn's prompts in one engine call, as the preset


def turns_setter(history_window: int | None) -> Callable[[Any, str], None]:
    def set_turns(config: Any, point: str) -> None:
        turns = int(point)
        config.rollouts(
            max_turns=turns, max_actions_per_turn=1, max_actions_per_traj=turns, history_window=history_window
        )

    return set_turns


def set_answer_length(config: Any, point: str) -> None:
    config.rollouts(think=True, response_length=int(point))


def set_model(config: Any, point: str) -> None:
    from shaped_random_models import SHAPES, shaped_random_model

    if point == "smollm2-135m-instruct":
        config.llm(model=point)
    elif point in SHAPES:
        config.llm(model=str(shaped_random_model(point)))
    else:
        raise UserError(f"unknown model point {point!r}; choose smollm2-135m-instruct or one of {sorted(SHAPES)}")


AXES = {
    "trajectories": Axis("trajectories", ("16", "32", "64", "128", "256"), set_trajectories),
    "turns-markov": Axis("turns", ("1", "3", "5", "10"), turns_setter(0)),
    "turns-full": Axis("turns", ("1", "3", "5", "10"), turns_setter(None)),
    "answer": Axis("answer tokens", ("4", "32", "128", "256"), set_answer_length),
    "model": Axis("M parameters", ("smollm2-135m-instruct", "smollm2-360m-shape", "qwen2.5-0.5b-shape"), set_model),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="frozenlake", help="registered env whose CPU preset is varied")
    parser.add_argument("--axis", action="append", choices=sorted(AXES), help="axis to run (repeatable; default all)")
    parser.add_argument("--points", help="comma-separated points of the one --axis given (default: all its points)")
    parser.add_argument("--iters", type=int, default=3, help="iterations per point, the first untimed (>= 2)")
    parser.add_argument(
        "--trajectories", type=int, help="trajectories per iteration on the other axes (default: the preset's)"
    )
    parser.add_argument("--model", help="model of every point but the model axis's (default: the preset's)")
    parser.add_argument("--engine", choices=("auto", "vllm", "hf"), help="rollout engine (default: the preset's)")
    parser.add_argument(
        "--point-timeout",
        type=float,
        default=1800.0,
        help="seconds a point may take, start-up included, before it is stopped",
    )
    parser.add_argument("--json", type=output_file, help="write every point's figures here, after each point")
    parser.add_argument("--from-json", type=Path, help="report the points of an earlier --json instead of running")
    parser.add_argument("--output", type=output_file, help="also write the report here, under its provenance")
    parser.add_argument("--plot", type=output_file, help="draw every axis's curves into this PNG")
    parser.add_argument("--measure-point", nargs=2, metavar=("AXIS", "POINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iters < 2:
        parser.error(f"--iters must be at least 2 (the first iteration is untimed), got {args.iters}")
    if args.points and len(args.axis or []) != 1:
        parser.error("--points needs exactly one --axis")
    return args


def planned_points(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(axis, point) pairs to run, in order."""
    axes = args.axis or list(AXES)
    if args.points:
        return [(axes[0], point.strip()) for point in args.points.split(",") if point.strip()]
    return [(axis, point) for axis in axes for point in AXES[axis].points]


def point_config(args: argparse.Namespace, axis: str, point: str) -> Any:
    """The CPU preset with evaluation off, the run's overrides and the point's setting."""
    from rllib_ragen.algorithm.presets import cpu_preset

    config = cpu_preset(args.env).starpo_evaluation(eval_interval=0)
    if args.model:
        config.llm(model=args.model)
    if args.engine:
        config.inference(engine=args.engine)
    if args.trajectories and axis != "trajectories":
        set_trajectories(config, str(args.trajectories))
    AXES[axis].apply(config, point)
    return config


def measure_point(config: Any, iters: int) -> dict[str, Any]:
    """Builds `config`'s algorithm, runs `iters` iterations and returns the medians of iterations 2+
    with the peak RSS of every process of this process's tree."""
    from iteration_breakdown import policy_parameters
    from process_memory import TreeMemory

    from rllib_ragen.run.ray_session import init_ray

    init_ray()
    memory = TreeMemory(os.getpid())
    with memory.watching():
        algo = config.build_algo()
        try:
            syncs = time_weight_syncs(algo)
            rows = [timed_iteration(algo, syncs) for _ in range(iters)]
            params = next(iter(algo.learner_group.foreach_learner(policy_parameters))).get()
            labels = process_labels(memory.peaks)
        finally:
            algo.stop()
    return {**point_figures(rows[1:], params), "iterations": rows, "processes": process_peaks(memory, labels)}


def time_weight_syncs(algo: Any) -> list[float]:
    """Times each of `algo`'s weight syncs (the transfer and its check) into the returned list."""
    seconds: list[float] = []
    sync = algo.sync_engine_weights

    def timed_sync() -> None:
        start = time.perf_counter()
        sync()
        seconds.append(time.perf_counter() - start)

    algo.sync_engine_weights = timed_sync  # the instance's own: training_step calls it through `self`
    return seconds


def timed_iteration(algo: Any, syncs: list[float]) -> dict[str, float]:
    """One `algo.train()`: its wall time split into rollout, weight sync and update (the rest), and its work."""
    synced = len(syncs)
    start = time.perf_counter()
    result = algo.train()
    seconds = time.perf_counter() - start
    timing = algo.env_runner.last_rollout_timing
    runners = result["env_runners"]
    learner = result.get("learners", {}).get("default_policy", {})
    sync = sum(syncs[synced:])  # none when the filter kept no group
    return {
        "seconds": seconds,
        "rollout_s": timing["total_s"],
        "generation_s": timing["engine_s"],
        "sync_s": sync,
        "update_s": seconds - timing["total_s"] - sync,
        "generated_tokens": runners["rollout_tokens_per_s"] * timing["total_s"],
        "prefilled_tokens": runners["rollout_prefill_tokens_per_s"] * timing["total_s"],
        "row_tokens": learner.get("num_row_tokens", float("nan")),
        "computed_tokens": learner.get("num_computed_tokens", float("nan")),
        "trajectories": runners["num_trajectories"],
        "turns_mean": runners["num_turns_mean"],
        "answer_tokens_mean": runners["response_length_mean"],
        "truncated_trajectories": runners["truncated_prompt_trajectories"],
    }


def point_figures(rows: list[dict[str, float]], params: PolicyParameters) -> dict[str, Any]:
    """Each figure's median over `rows`, and the phases' GFLOP/s at those medians."""
    from iteration_breakdown import phase_gflops

    medians = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    gflops = phase_gflops(
        params,
        row_tokens=medians["row_tokens"],
        computed_tokens=medians["computed_tokens"],
        update_s=medians["update_s"],
        generated_tokens=medians["generated_tokens"],
        prefilled_tokens=medians["prefilled_tokens"],
        generation_s=medians["generation_s"],
    )
    return {**medians, **gflops, "parameters": params.all, "trained_parameters": params.trained}


def process_labels(peaks: dict[int, float]) -> dict[int, str]:
    """Each live process's title (Ray names an actor's process after its class), by pid."""
    import psutil

    labels = {}
    for pid in peaks:
        try:
            labels[pid] = " ".join(psutil.Process(pid).cmdline())[:48] or psutil.Process(pid).name()
        except psutil.Error:  # ended since its last sample
            continue
    return labels


def process_peaks(memory: Any, labels: dict[int, str]) -> list[dict[str, Any]]:
    """Peak RSS (MiB) of each process over REPORTED_PROCESS_MB, largest first; the driver is this process."""
    driver = os.getpid()
    rows = [
        {"pid": pid, "role": "driver" if pid == driver else labels.get(pid, memory.names[pid]), "peak_mb": mb}
        for pid, mb in memory.peaks.items()
        if mb >= REPORTED_PROCESS_MB or pid == driver
    ]
    return sorted(rows, key=lambda row: -row["peak_mb"])


def run_point(args: argparse.Namespace, axis: str, point: str) -> dict[str, Any]:
    """One point in a fresh process; its figures, or the error that ended it."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--measure-point",
        axis,
        point,
        "--env",
        args.env,
        "--iters",
        str(args.iters),
    ]
    for flag in ("trajectories", "model", "engine"):
        if getattr(args, flag):
            command += [f"--{flag}", str(getattr(args, flag))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # cwd ROOT: Ray puts the driver's working directory on its workers' path, ahead of PYTHONPATH.
    try:
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.point_timeout)
    except subprocess.TimeoutExpired:
        return {"axis": axis, "point": point, "error": f"did not finish within --point-timeout {args.point_timeout} s"}
    if done.returncode != 0:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
        return {"axis": axis, "point": point, "error": f"exit code {done.returncode}: " + " | ".join(tail)}
    return {"axis": axis, "point": point, **json.loads(done.stdout.strip().splitlines()[-1])}


def run_points(args: argparse.Namespace, saved: dict[str, Any]) -> list[dict[str, Any]]:
    """Every planned point, one after the other, with a progress line each (and --json, `saved` with the
    points so far, after each)."""
    planned, points = planned_points(args), []
    for number, (axis, point) in enumerate(planned, 1):
        print(f"[{number}/{len(planned)}] {axis}={point}: running {args.iters} iterations", flush=True)
        began = time.perf_counter()
        points.append(run_point(args, axis, point))
        print(
            f"[{number}/{len(planned)}] {axis}={point}: {point_summary(points[-1])} "
            f"({time.perf_counter() - began:.0f} s with start-up)",
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(json.dumps({**saved, "points": points}, indent=1))
    return points


def stored_ceiling(saved: dict[str, Any]) -> tuple[float, str]:
    """(GFLOP/s, dtype) of a run's matmul ceiling; runs stored before the dtype was recorded measured bf16."""
    if "ceiling_gflops" in saved:
        return saved["ceiling_gflops"], saved["ceiling_dtype"]
    return saved["bf16_ceiling_gflops"], "bfloat16"


def point_summary(point: dict[str, Any]) -> str:
    if "error" in point:
        return f"failed, {point['error']}"
    return (
        f"{point['seconds']:.1f} s/iteration = rollout {point['rollout_s']:.1f} + update {point['update_s']:.1f}"
        f" + sync {point['sync_s']:.1f}"
    )


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure_point:
        axis, point = args.measure_point
        print(json.dumps(measure_point(point_config(args, axis, point), args.iters)))
        return
    from cost_report import publish, report_lines

    from rllib_ragen.run.provenance import header

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
    else:
        import torch
        from rollout_throughput import matmul_gflops

        from rllib_ragen.hardware import fast_bf16

        # The provenance before the runs (the commit they ran), the ceiling on the machine they share, in the
        # dtype the CPU preset computes in there (float32 where bf16 matmuls are emulated: their ceiling,
        # 1-2 GFLOP/s on an AVX2-only CPU, says nothing of the float32 run).
        dtype = torch.bfloat16 if fast_bf16() else torch.float32
        saved = {"provenance": header(ROOT, argv), "ceiling_dtype": str(dtype).removeprefix("torch.")}
        saved["ceiling_gflops"] = matmul_gflops(dtype)
        print(f"{saved['ceiling_dtype']} matmul ceiling: {saved['ceiling_gflops']:.0f} GFLOP/s", flush=True)
        saved["points"] = run_points(args, saved)
    publish(
        report_lines(saved["points"], *stored_ceiling(saved)),
        saved["points"],
        output=args.output,
        plot_path=args.plot,
        provenance=saved["provenance"],
    )


if __name__ == "__main__":
    main()
