"""Engine kills: SIGKILL the vLLM engine actor's process at random moments of one training run's
rollouts, and check that the run finishes with each iteration logged once in MLflow and that every
replaced engine serves the learner's current weights.

The run is a tuned example's (`--env`, its flags) in this process, with MLflow in `./mlflow.db` of a
fresh working directory. A thread waits for a training rollout to start (the algorithm's sampler
call), sleeps a moment drawn uniformly from [0, --max-delay-s] s, or from [0, the last rollout's
length] when that is shorter (seeded), and, if that rollout is still running, finds this job's live
engine actors in Ray's actor table and SIGKILLs one's process by pid (`os.kill`); then it waits for
the replacement and for the next rollout. Ray's actor table is read from its GCS
(`rllib_private.actor_table`): `ray.util.state.list_actors` would need the dashboard, which the run
leaves off. The pool replaces the dead actor, loads the current weights into it and sends its shard
again; after that rollout the algorithm scores a fixed probe on every engine
(`weight_sync/replaced_engine_logp_max_abs_diff` against the learner, whose weights are the ones last
synced; `weight_sync/replaced_engine_drift` against what the engines scored right after that sync).

    python benchmarks/engine_kills.py --kills 10 --output docs/results/engine_kills.md
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import ray
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils import force_list
from ray.rllib.utils.annotations import override

from envs.user_errors import CLIParser, front_door
from rllib_ragen.inference.vllm.actor import VLLMEngineActor
from rllib_ragen.rllib_private import actor_table
from rllib_ragen.run.given_paths import output_file
from rllib_ragen.run.provenance import header

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "engine-kills"
RUN_DIR = Path("checkpoints") / "run"
GAP = "weight_sync/replaced_engine_logp_max_abs_diff"
DRIFT = "weight_sync/replaced_engine_drift"
RESTARTS = "engine_restarts"
SYNC_GAP = "weight_sync/engine_logp_max_abs_diff"
REPLACEMENT_TIMEOUT_S = 1800.0  # a replacement on a loaded 2-core machine loads the model again


class KillPlan(NamedTuple):
    """What the killer does (plain data: RLlib copies the config that carries it; a NamedTuple, not a
    dataclass, so that tests can load this script without registering it as a module).

    Attributes:
        kills: SIGKILLs, at most one per training rollout.
        from_iteration: The first iteration whose rollout may see one (2: after an update).
        max_delay_s: Each comes at a moment uniform in [0, this] s after a rollout starts, or
            in [0, the last rollout's length] when that is shorter (so that most land in one).
        seed: Seed of those moments and of the engine picked.
        record: One JSON line per kill is appended here.
    """

    kills: int
    from_iteration: int
    max_delay_s: float
    seed: int
    record: Path


class EngineKillCallback(RLlibCallback):
    """Starts an `EngineKiller` on the algorithm once it is set up."""

    def __init__(self, plan: KillPlan) -> None:
        super().__init__()
        self.plan = plan

    @override(RLlibCallback)
    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        EngineKiller(algorithm, self.plan).start()


class EngineKiller(threading.Thread):
    """SIGKILLs the local env runner's vLLM engine actors during training rollouts (see the module)."""

    def __init__(self, algorithm: Any, plan: KillPlan) -> None:
        super().__init__(name="engine-killer", daemon=True)
        self.algorithm, self.plan, self.rng = algorithm, plan, random.Random(plan.seed)
        self.pool = algorithm.env_runner.engine
        self.rollouts = 0  # training rollouts started so far
        self.last_rollout_s = plan.max_delay_s
        self.in_rollout = threading.Event()
        self.changed = threading.Condition()

    def run(self) -> None:
        while not hasattr(self.algorithm, "sampler"):  # StarPO makes it after RLlib's setup calls back
            time.sleep(0.2)
        self._watch(self.algorithm.sampler)
        seen, done = 0, 0
        while done < self.plan.kills:
            with self.changed:  # a rollout that started after the last kill
                self.changed.wait_for(functools.partial(self._rollouts_after, seen))
                seen = self.rollouts
            delay = self.rng.uniform(0, min(self.plan.max_delay_s, self.last_rollout_s))
            time.sleep(delay)
            if not self.in_rollout.is_set() or self.rollouts != seen:
                continue  # that rollout ended first: the kill waits for another
            done += 1
            self._kill(done, delay=delay, rollout=seen)

    def _watch(self, sampler: Any) -> None:
        """Wraps `sampler.sample` to count the rollouts, flag the one running and time each."""
        sample = sampler.sample

        @functools.wraps(sample)
        def watched_sample(**kwargs: Any) -> Any:
            with self.changed:
                self.rollouts += 1
                self.in_rollout.set()
                self.changed.notify_all()
            started = time.monotonic()
            try:
                return sample(**kwargs)
            finally:
                self.in_rollout.clear()
                self.last_rollout_s = time.monotonic() - started

        sampler.sample = watched_sample

    def _rollouts_after(self, seen: int) -> bool:
        return self.rollouts > seen and self.algorithm.iteration + 1 >= self.plan.from_iteration

    def _kill(self, number: int, *, delay: float, rollout: int) -> None:
        actor_id, pid = self.rng.choice(live_engines())
        restarts = self.pool.restarts
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        entry = {
            "kill": number, "iteration": self.algorithm.iteration + 1, "rollout": rollout, "pid": pid,
            "actor_id": actor_id, "delay_s": round(delay, 2),
        }  # fmt: skip
        while self.pool.restarts == restarts and time.monotonic() - killed < REPLACEMENT_TIMEOUT_S:
            time.sleep(0.2)
        entry["replaced_after_s"] = round(time.monotonic() - killed, 1) if self.pool.restarts > restarts else None
        with self.plan.record.open("a") as file:
            file.write(json.dumps(entry) + "\n")


def live_engines() -> list[tuple[str, int]]:
    """(actor id, pid) of this job's live vLLM engine actors, from Ray's actor table."""
    job = ray.get_runtime_context().get_job_id()
    engines = [
        (actor["ActorID"], int(actor["Pid"]))
        for actor in actor_table()
        if actor["ActorClassName"] == VLLMEngineActor.__name__
        and actor["JobID"] == job
        and actor["State"] == "ALIVE"
        and actor["Pid"]
    ]
    if not engines:
        raise RuntimeError("no live vLLM engine actor of this job in Ray's actor table")
    return sorted(engines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs of an engine, at most one per rollout")
    parser.add_argument(
        "--max-delay-s",
        type=float,
        default=60.0,
        help="a kill comes in [0, this] s into a rollout (or [0, the last rollout's length] when shorter)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments and engines")
    parser.add_argument(
        "--from-iteration", type=int, default=2, help="the first iteration a kill may come in (2: after an update)"
    )
    parser.add_argument("--env", default="bandit", help="the tuned example's env")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="its --model")
    parser.add_argument("--stop-iters", type=int, default=16, help="iterations of the run (kills need as many)")
    parser.add_argument(
        "--extra",
        default="--engine vllm --n-groups 2 --group-size 2 --eval-size 4 --no-warm-start --set eval_interval=5",
        help="more flags of the tuned example (one string)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.3,
        help="largest log-prob gap of a replaced engine to the learner, and to its own scores after the sync "
        "(SmolLM2's bf16 engine against its float32 learner: 0.1-0.2 after any sync)",
    )
    parser.add_argument("--workdir", type=Path, help="working directory (default: a new temporary one)")
    parser.add_argument("--output", type=output_file, help="write the result as markdown here")
    return parser.parse_args(argv)


def train_with_kills(args: argparse.Namespace, workdir: Path) -> None:
    """The tuned example's run (as `experiment.main` starts it) with an `EngineKillCallback`, in `workdir`."""
    from rllib_ragen.run.experiment import checked_inputs, open_tracking_store, tuned_run
    from rllib_ragen.run.flags import build_parser
    from rllib_ragen.run.starting_model import choose_starting_model
    from rllib_ragen.run.train_loop import run

    tuned = tuned_run(args.env)
    parser = build_parser(env=args.env, **dataclasses.asdict(tuned))
    flags = ["--model", args.model, "--stop-iters", str(args.stop_iters), "--experiment", EXPERIMENT]
    run_args = parser.parse_args([*flags, "--checkpoint-dir", str(RUN_DIR), *shlex.split(args.extra)])
    plan = KillPlan(args.kills, args.from_iteration, args.max_delay_s, args.seed, workdir / "kills.jsonl")
    os.chdir(workdir)
    config = checked_inputs(run_args)
    kept = [c for c in force_list(config.callbacks_class) if c is not RLlibCallback]
    config.callbacks(callbacks_class=[*kept, functools.partial(EngineKillCallback, plan)])
    open_tracking_store(run_args)
    tags = choose_starting_model(config, run_args)
    run(config, run_args, tags={**tags, "preset": run_args.preset})


def read_kills(workdir: Path) -> list[dict]:
    """The kills `EngineKiller` recorded in `workdir`, in order."""
    record = workdir / "kills.jsonl"
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def metric(client: Any, run_id: str, key: str) -> dict[int, list[float]]:
    """Each step's values of `key` in run `run_id`."""
    values: dict[int, list[float]] = {}
    for entry in client.get_metric_history(run_id, key):
        values.setdefault(entry.step, []).append(entry.value)
    return values


def check_run(args: argparse.Namespace, workdir: Path, kills: list[dict]) -> dict[str, tuple[bool, str]]:
    """The checks, by name: (passed, what was found)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    if len(runs) != 1:
        return {"one MLflow run": (False, f"{len(runs)} runs")}
    run_id, status = runs[0].info.run_id, runs[0].info.status
    steps = metric(client, run_id, "training_iteration")
    expected = list(range(1, args.stop_iters + 1))
    once = sorted(steps) == expected and all(len(v) == 1 for v in steps.values())
    restarts = metric(client, run_id, RESTARTS)
    last_restarts = restarts[max(restarts)][-1] if restarts else None
    replacements = replacement_checks(client, run_id, restarts)
    return {
        "the run finishes": (status == "FINISHED", f"MLflow status {status}"),
        "each iteration logged once": (
            once,
            f"training_iteration: {sum(len(v) for v in steps.values())} values for steps {min(steps, default=0)}.."
            f"{max(steps, default=0)} (expected 1..{args.stop_iters}, once each)",
        ),
        "every kill replaced": (
            len(kills) == args.kills
            and all(k["replaced_after_s"] is not None for k in kills)
            and last_restarts == len(kills),
            f"{len(kills)} of {args.kills} kills done, each replaced; engine_restarts at the end {last_restarts}",
        ),
        "replaced engines serve the current weights": (
            bool(replacements) and all(max(values) <= args.tolerance for _, values in replacements),
            "; ".join(f"iteration {step}: {', '.join(f'{v:.4f}' for v in values)}" for step, values in replacements),
        ),
    }


def replacement_checks(client: Any, run_id: str, restarts: dict[int, list[float]]) -> list[tuple[int, list[float]]]:
    """(iteration, its log-prob gaps) for each iteration in which engines were replaced: after the rollout
    (a kill the rollout met) the gap to the learner and the drift since the sync, and the gap of its
    sync (which checks a replacement the sync met, the kill having come after the rollout's last call)."""
    gaps, drifts = metric(client, run_id, GAP), metric(client, run_id, DRIFT)
    synced = metric(client, run_id, SYNC_GAP)
    replaced = [step for step in sorted(restarts) if restarts[step][-1] > restarts.get(step - 1, [0.0])[-1]]
    inf = [float("inf")]  # a missing sync check fails
    return [(step, [*gaps.get(step, []), *drifts.get(step, []), *synced.get(step, inf)]) for step in replaced]


def summary(kills: list[dict], checks: dict[str, tuple[bool, str]], sync_gaps: dict[int, list[float]]) -> str:
    rows = [
        f"| {k['kill']} | {k['iteration']} | {k['delay_s']:.1f} | {k['pid']} | "
        f"{k['replaced_after_s']} | {', '.join(f'{v:.4f}' for v in sync_gaps.get(k['iteration'] - 1, [])) or '-'} |"
        for k in kills
    ]
    lines = [
        "| kill | iteration | into its rollout [s] | pid | replacement started after [s] | previous sync's gap |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        *(f"- {'PASS' if ok else 'FAIL'} {name}: {detail}" for name, (ok, detail) in checks.items()),
    ]
    return "\n".join(lines) + "\n"


def sync_gaps(workdir: Path) -> dict[int, list[float]]:
    """Each iteration's `weight_sync/engine_logp_max_abs_diff` (after its update's sync)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return metric(client, runs[0].info.run_id, SYNC_GAP) if len(runs) == 1 else {}


@front_door
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="engine-kills-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"engine kills in {workdir}: {args.kills} kills, [0, {args.max_delay_s}] s into rollouts", flush=True)
    from rllib_ragen.run import callbacks, warm_start  # noqa: F401  (their console handlers go to the log too)
    from rllib_ragen.run.console import route_library_logs
    from rllib_ragen.run.experiment import RUN_LOG

    route_library_logs(workdir / RUN_DIR / RUN_LOG)
    print(f"library logs: {workdir / RUN_DIR / RUN_LOG}", flush=True)
    try:
        train_with_kills(args, workdir)
        kills = read_kills(workdir)
        checks = check_run(args, workdir, kills)
        text = summary(kills, checks, sync_gaps(workdir))
        print(text, end="")
        if args.output:
            args.output.write_text(f"# Engine kills\n\n{header(ROOT, argv)}\n{text}")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(ok for ok, _ in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
