"""Every command's front door: a table of bad inputs, each answered by one `error:` line and exit code 2.

Each row is a real command in a new process (a tuned example, `rllib-ragen
train/evaluate/sweep/models`, a benchmark that takes paths, the OpenEnv server) with one bad
input, and the words its error line must contain. Each run must exit with code 2, write exactly
one line to stderr, starting with `error:` and holding those words, and start no Ray (the row's
RAY_TMPDIR stays empty) and leave no process behind (none carrying the row's marker variable).

Two kinds of rows. A *light* row's input is refused before Ray, torch or vLLM is imported (a
sitecustomize probe records the heavy modules the command imported): it runs as `python ...`
in a new interpreter. A *warm* row's check needs the config, whose classes import Ray and torch:
it runs as the same command in a child forked from a warm interpreter that imported those once
(`warm_interpreter.py`; its own stderr must stay empty, so an import warning still fails the
table), and must not import vLLM. The whole table runs at once on a small pool, before the first
row's test reads its result.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_helpers import ROOT, free_port

from conftest import require_extra

WARM_INTERPRETER = Path(__file__).with_name("warm_interpreter.py")
HEAVY = ("torch", "ray", "vllm")
# Written as sitecustomize.py on the commands' path: at exit, the heavy modules the command had imported.
IMPORT_PROBE = """
import atexit, json, os, sys
def _record():
    if "FRONT_DOOR_MODULES" in os.environ:  # a row's command, not the warm interpreter
        with open(os.environ["FRONT_DOOR_MODULES"], "w") as file:
            json.dump([name for name in {heavy!r} if name in sys.modules], file)
atexit.register(_record)
""".format(heavy=HEAVY)
FROZENLAKE = "tuned_examples/frozenlake_starpo.py"
SOKOBAN = "tuned_examples/sokoban_starpo.py"
BANDIT = "tuned_examples/bandit_starpo.py"
COUNTDOWN = "tuned_examples/countdown_starpo.py"
OFFLINE = "tuned_examples/sokoban_offline.py"
SWEEP = "tuned_examples/sweep_starpo.py"
CLI = ("-m", "rllib_ragen")
SERVER = ("-m", "envs.openenv_server")
WARM_POOL = 2  # warm interpreters (2 cores); light rows run beside them


@dataclasses.dataclass(frozen=True)
class Row:
    """One bad input: the command's argv after `python` ({name} fills in a prepared input), the
    words its error line must hold, and whether it is refused before any heavy import."""

    argv: tuple[str, ...]
    words: tuple[str, ...]
    light: bool = False

    @property
    def id(self) -> str:
        return " ".join(self.argv)


def light(*argv: str, words: tuple[str, ...] | str) -> Row:
    return Row(argv, (words,) if isinstance(words, str) else words, light=True)


def warm(*argv: str, words: tuple[str, ...] | str) -> Row:
    return Row(argv, (words,) if isinstance(words, str) else words)


# Every numeric setting with a bound: (setting, a value outside it, what its error says).
BOUNDS = (
    ("trained_top_layers", "-1", "trained_top_layers must be >= 1 or None"),
    ("lora_rank", "-1", "lora_rank must be an int >= 0"),
    ("lora_alpha", "-1", "lora_alpha must be > 0"),
    ("lora_dropout", "1.0", "lora_dropout must be in [0, 1)"),
    ("lora_top_layers", "-1", "lora_top_layers must be an int >= 0"),
    ("n_groups", "0", "n_groups must be >= 1"),
    ("group_size", "-1", "group_size must be >= 1"),
    ("response_length", "0", "response_length must be >= 1"),
    ("temperature", "0", "temperature must be > 0"),
    ("env_step_timeout_s", "0", "env_step_timeout_s must be > 0 or None"),
    ("max_turns", "0", "max_turns must be >= 1"),
    ("max_actions_per_traj", "0", "max_actions_per_traj must be >= 1"),
    ("format_penalty", "1", "format_penalty must be <= 0"),
    ("max_actions_per_turn", "0", "max_actions_per_turn must be >= 1"),
    ("history_window", "-1", "history_window must be >= 0 or None"),
    ("max_staleness", "-1", "max_staleness must be >= 0"),
    ("num_engines", "0", "num_engines must be > 0"),
    ("kv_cache_gb", "0", "kv_cache_gb must be > 0"),
    ("max_model_len", "0", "max_model_len must be > 0"),
    ("kv_block_size", "0", "kv_block_size must be > 0"),
    ("num_gpus_per_engine", "-1", "num_gpus_per_engine, num_cpus_per_engine and max_engine_restarts_per_call must be >= 0"),
    ("tensor_parallel_size", "0", "tensor_parallel_size must be > 0"),
    ("engine_threads", "0", "engine_threads must be > 0"),
    ("num_cpus_per_engine", "-1", "num_gpus_per_engine, num_cpus_per_engine and max_engine_restarts_per_call must be >= 0"),
    ("max_batch_size", "0", "max_batch_size must be > 0"),
    ("max_engine_restarts_per_call", "-1", "max_engine_restarts_per_call must be >= 0"),
    ("engine_start_timeout_s", "0", "engine_start_timeout_s must be > 0"),
    ("engine_call_timeout_s", "0", "engine_call_timeout_s must be > 0"),
    ("weight_sync_timeout_s", "0", "weight_sync_timeout_s must be > 0"),
    ("entropy_coeff", "-1", "kl_coeff and entropy_coeff must be >= 0"),
    ("kl_coeff", "-1", "kl_coeff and entropy_coeff must be >= 0"),
    ("rollout_frequency", "0", "rollout_frequency must be >= 1"),
    ("mini_batch_size", "0", "mini_batch_size must be >= 1 or None"),
    ("micro_batch_size", "0", "micro_batch_size must be >= 1"),
    ("micro_batch_tokens", "0", "micro_batch_tokens must be >= 1 or None"),
    ("torch_threads", "0", "torch_threads must be >= 1 or None"),
    ("logit_chunk_size", "0", "logit_chunk_size must be >= 1"),
    ("actor_lr", "-1", "actor_lr and critic_lr must be >= 0"),
    ("critic_lr", "-1", "actor_lr and critic_lr must be >= 0"),
    ("rollout_filter_ratio", "0", "rollout_filter_ratio must be in (0, 1]"),
    ("rollout_filter_top_p", "1.5", "rollout_filter_top_p must be in (0, 1]"),
    ("tis_cap", "0", "tis_cap must be > 0"),
    ("mis_low", "0", "need 0 < mis_low <= 1 <= mis_high"),
    ("mis_high", "0.5", "need 0 < mis_low <= 1 <= mis_high"),
    ("think_min_words", "-1", "need 0 <= think_min_words <= think_max_words"),
    ("think_max_words", "-1", "need 0 <= think_min_words <= think_max_words"),
    ("advantage_length_weight", "-1", "advantage_length_weight must be >= 0"),
    ("collapse_metrics_interval", "-1", "collapse_metrics_interval must be >= 0"),
    ("collapse_metrics_samples", "1", "collapse_metrics_samples must be >= 2"),
    ("echo_trap_baseline_iters", "0", "echo_trap_baseline_iters must be >= 1"),
    ("echo_trap_patience", "0", "echo_trap_patience must be >= 1"),
    ("echo_trap_ratio", "1", "echo_trap_ratio must be in (0, 1)"),
    ("eval_interval", "-1", "eval_interval and eval_temperature must be >= 0"),
    ("eval_size", "0", "eval_size must be >= 1"),
    ("eval_temperature", "-1", "eval_interval and eval_temperature must be >= 0"),
    ("write_rollouts_every", "0", "write_rollouts_every must be >= 1"),
)
TUNED = (FROZENLAKE, SOKOBAN, BANDIT, COUNTDOWN)

TABLE = (
    # The three --model inputs, and the other ways a model directory can be wrong.
    warm(FROZENLAKE, "--model", "/nonexistent/dir", words=("Model directory '/nonexistent/dir' does not exist",)),
    warm(FROZENLAKE, "--model", "{empty_dir}", words=("is not a Hugging Face model directory", "no config.json")),
    warm(FROZENLAKE, "--model", "smollm2-nonexistent", words=("Unknown model 'smollm2-nonexistent'", "Built-in")),
    warm(SOKOBAN, "--model", "{no_weights}", words="has config.json but no weights"),
    warm(SOKOBAN, "--model", "{no_tokenizer}", words="has no tokenizer files"),
    warm(BANDIT, "--model", "{no_template}", words="has no chat template"),
    warm(COUNTDOWN, "--model", "{truncated}", words=("model.safetensors", "is cut short")),
    warm(FROZENLAKE, "--model", "{bad_header}", words=("model.safetensors", "header is cut short or invalid")),
    warm(FROZENLAKE, "--model", "{tiny}", "--warm-start-model", "/nonexistent/ws", words="does not exist"),
    warm(FROZENLAKE, "--model", "{tiny}", "--warm-start-model", "{truncated}", words="is cut short"),
    warm(FROZENLAKE, "--model", "{tiny}", words=("the cached model", "warm-start-", "is damaged", "rebuild")),
    # Envs and their configs.
    light(FROZENLAKE, "--env", "nope", words=("unknown env 'nope'", "registered envs")),
    light(SOKOBAN, "--env", "mod_missing:Env", words="cannot import module 'mod_missing'"),
    light(*CLI, "train", "--env", "sokobann", words="unknown env 'sokobann'"),
    warm(SOKOBAN, "--model", "{tiny}", "--set", "env_config={'dim_room': 'big'}", words="dim_room must be two ints"),
    warm(FROZENLAKE, "--model", "{tiny}", "--set", "env_config=[1, 2]", words="env_config takes dict"),
    warm(FROZENLAKE, "--model", "{tiny}", "--set", "env_config={'size': -3}", words="size must be an int >= 2"),
    warm(COUNTDOWN, "--model", "{tiny}", "--set", "env_config={'num_numbers': 9}", words="num_numbers must be between"),
    # Settings: unknown, of the wrong type, every bounded one out of range.
    warm(FROZENLAKE, "--set", "no_such_key=1", words="unknown config key 'no_such_key'"),
    warm(FROZENLAKE, "--model", "{tiny}", "--set", "eval_seed=10100",
         words=("evaluation seeds 10100..", "overlap the training seeds 10000..")),
    warm(FROZENLAKE, "--set", "actor_lr=abc", words="actor_lr takes float"),
    warm(FROZENLAKE, "--set", "group_size=2.5", words="group_size takes int"),
    warm(FROZENLAKE, "--set", "actor_lr", words="--set expects KEY=VALUE"),
    warm(FROZENLAKE, "--estimator", "nope", words="advantage_estimator must be one of"),
    *(
        warm(TUNED[i % len(TUNED)], "--model", "{tiny}", "--set", f"{key}={value}", words=message)
        for i, (key, value, message) in enumerate(BOUNDS)
    ),
    # Flags: unknown, out of range, contradicting.
    light(FROZENLAKE, "--bogus-flag", words=("unrecognized arguments: --bogus-flag", "--help")),
    light(FROZENLAKE, "--stop-iters", "0", words=("--stop-iters", "must be an integer >= 1")),
    light(FROZENLAKE, "--n-groups", "x", words=("--n-groups", "must be an integer >= 1")),
    light(FROZENLAKE, "--group-size", "0", words="--group-size"),
    light(FROZENLAKE, "--max-turns", "-2", words="--max-turns"),
    light(FROZENLAKE, "--num-engines", "0", words="--num-engines"),
    light(FROZENLAKE, "--eval-size", "0", words="--eval-size"),
    light(FROZENLAKE, "--warm-start-examples", "0", words="--warm-start-examples"),
    light(FROZENLAKE, "--time-budget-min", "-1", words=("--time-budget-min", "must be a number > 0")),
    light(FROZENLAKE, "--job-budget-min", "0", words="--job-budget-min"),
    light(FROZENLAKE, "--checkpoint-every", "0", words="--checkpoint-every"),
    light(FROZENLAKE, "--keep-checkpoints", "0", words="--keep-checkpoints"),
    light(FROZENLAKE, "--log-checkpoint-every", "-1", words=("--log-checkpoint-every", "must be an integer >= 0")),
    light(FROZENLAKE, "--preset", "tpu", words=("--preset", "invalid choice: 'tpu'")),
    light(FROZENLAKE, "--engine", "tpu", words=("--engine", "invalid choice")),
    light(FROZENLAKE, "--warm-start", "genius", words=("--warm-start", "invalid choice")),
    light(COUNTDOWN, "--as-test", words="--as-test needs --success-threshold"),
    light(FROZENLAKE, "--warm-start-model", "{tiny}", "--no-warm-start", words="contradict each other"),
    warm(FROZENLAKE, "--model", "{tiny}", "--set", "mini_batch_size=4", "--set", "micro_batch_size=8",
         words="micro_batch_size=8 is larger than mini_batch_size=4"),
    warm(FROZENLAKE, "--model", "{tiny}", "--set", "max_model_len=12", words="leaves no room for a prompt"),
    warm(FROZENLAKE, "--model", "{tiny}", "--set", "gpu_memory_utilization=0.5", words="num_gpus_per_engine=0"),
    # Checkpoint and tracking paths.
    light(FROZENLAKE, "--checkpoint-dir", "{file}", words=("--checkpoint-dir", "cannot be used", "is not a directory")),
    light(FROZENLAKE, "--checkpoint-dir", "{file}/run", words=("cannot be used", "a_file is not a directory")),
    warm(FROZENLAKE, "--model", "{tiny}", "--checkpoint-dir", "{finished_run}", words=("holds a checkpoint", "--resume")),
    warm(FROZENLAKE, "--model", "{tiny}", "--resume", "--checkpoint-dir", "{not_a_checkpoint}",
         words=("is marked complete but is not a StarPO checkpoint", "rllib_checkpoint.json")),
    light(FROZENLAKE, "--tracking-uri", "sqlite:///{file}/mlflow.db", words=("--tracking-uri", "is not a directory")),
    light(FROZENLAKE, "--tracking-uri", "sqlite:///{empty_dir}", words=("--tracking-uri", "is a directory")),
    light(FROZENLAKE, "--tracking-uri", "http://127.0.0.1:{closed_port}", words=("did not answer within", "refused")),
    light(BANDIT, "--tracking-uri", "http://127.0.0.1:{silent_port}", words=("did not answer within 5 s", "timed out")),
    # The command line itself.
    light(*CLI, words="the following arguments are required: COMMAND"),
    light(*CLI, "trian", words=("invalid choice: 'trian'",)),
    light(*CLI, "train", words="needs --env NAME"),
    light(*CLI, "train", "--env", "bandit", "--bogus", words="unrecognized arguments: --bogus"),
    # Evaluation.
    warm(*CLI, "evaluate", "/nonexistent/policy", "--env", "bandit", words="does not exist"),
    warm(*CLI, "evaluate", "{empty_dir}", "--env", "bandit", words="is neither a Hugging Face model directory"),
    warm(*CLI, "evaluate", "{not_a_checkpoint}", words=("No such file or directory", "class_and_ctor_args.pkl")),
    warm(*CLI, "evaluate", "{tiny}", words="--env or --generalisation is needed"),
    warm(*CLI, "evaluate", "{tiny}", "--env", "nope", words="unknown env 'nope'"),
    warm(*CLI, "evaluate", "{tiny}", "--env", "bandit", "--set", "group_size=0", words="group_size must be >= 1"),
    warm(*CLI, "evaluate", "{truncated}", "--env", "bandit", words="is cut short"),
    light(*CLI, "evaluate", "{tiny}", "--env", "bandit", "--episodes", "0", words="--episodes must be >= 1"),
    light(*CLI, "evaluate", "{tiny}", "--env", "bandit", "--temperature", "-1", words="--temperature must be >= 0"),
    light(*CLI, "evaluate", "{tiny}", "--env", "bandit", "--generalisation", words="not allowed with argument"),
    light(*CLI, "evaluate", "{tiny}", "--env", "bandit", "--output-dir", "{file}", words="--output-dir"),
    light(*CLI, "evaluate", "{tiny}", "--env", "bandit", "--tracking-uri", "http://127.0.0.1:{closed_port}",
          words="did not answer"),
    # Sweeps.
    warm(*CLI, "sweep", "--model", "{tiny}", "--grid", "no_such_key=1,2", words="unknown config key 'no_such_key'"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--grid", "group_size=a,b", words="group_size takes int"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--grid", "group_size=4", "--grid", "group_size=8", words="twice"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--grid", "group_size=", words="has no values"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--grid", "groupsize", words="--grid expects KEY=VALUE"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--grid", "group_size=-1,4", words=("grid point", "group_size must be >= 1")),
    warm(*CLI, "sweep", "--model", "{tiny}", "--scheduler", "nope", words="invalid choice: 'nope'"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--max-concurrent", "0", words="max_concurrent must be >= 1"),
    warm(*CLI, "sweep", "--model", "{tiny}", "--stop-iters", "2", "--grace-period", "5", words="grace_period must be in"),
    warm(SWEEP, "--env", "nope", words="unknown env 'nope'"),
    warm(SWEEP, "--model", "{tiny}", "--tracking-uri", "sqlite:///{file}/x.db", words="is not a directory"),
    # Models.
    warm(*CLI, "models", "pull", "nonexistent-model", words="Unknown model 'nonexistent-model'"),
    warm(*CLI, "models", "pull", "{no_template}", words="has no chat template"),
    warm(*CLI, "models", "fetch", "x", words="invalid choice: 'fetch'"),
    warm("-m", "rllib_ragen.models", words="required"),
    # The offline tuned example.
    light(OFFLINE, "--num-demos", "0", words="--num-demos"),
    light(OFFLINE, "--lr", "0", words="--lr"),
    light(OFFLINE, "--data-dir", "{file}/demos", words=("--data-dir", "cannot be used")),
    warm(OFFLINE, "--model", "/nonexistent/dir", words="does not exist"),
    warm(OFFLINE, "--model", "{tiny}", "--demo-seed", "100", words="overlap evaluation seeds"),
    # Benchmarks that take paths.
    warm("benchmarks/scripted_baselines.py", "--output", "{file}/table.md", words=("--output", "cannot be written")),
    light("benchmarks/paper_table.py", "--output", "{empty_dir}", words=("--output", "is a directory")),
    light("benchmarks/iteration_breakdown.py", "--output", "{file}/x.md", words="--output"),
    light("benchmarks/warm_start_speed.py", "--output", "{file}/x.md", words="--output"),
    warm("benchmarks/kill_campaign.py", "--output", "{file}/x.md", words="--output"),
    light("benchmarks/async_rollouts.py", "--json", "{file}/x.json", words="--json"),
    warm("benchmarks/learning_curve.py", "--tracking-uri", "sqlite:///{empty_dir}/missing.db", "--experiment", "x",
          "--output", "{empty_dir}/curve.png", words="no MLflow store at"),
    warm("benchmarks/echo_trap_figure.py", "--store", "frozenlake", "--output", "{empty_dir}/echo.png",
          words="--store takes ENV=URI"),
    warm("benchmarks/echo_trap_figure.py", "--store", "frozenlake=sqlite:///{empty_dir}/none.db",
          "--output", "{empty_dir}/echo.png", words="no MLflow store at"),
    warm("benchmarks/learner_throughput.py", "--variants", "nope", words="unknown variants"),
    # The OpenEnv server.
    light(*SERVER, words="the following arguments are required: --env"),
    light(*SERVER, "--env", "nope", words="cannot serve env 'nope': unknown env 'nope'"),
    light(*SERVER, "--env", "corridor", "--set", "distance", words="--set takes KEY=VALUE"),
    light(*SERVER, "--env", "corridor", "--set", "colour=red", words="does not accept config key(s) ['colour']"),
    light(*SERVER, "--env", "frozenlake", "--set", "size=-3", words="size must be an int >= 2"),
    light(*SERVER, "--env", "corridor", "--max-sessions", "0", words="--max-sessions must be >= 1"),
    light(*SERVER, "--env", "corridor", "--session-timeout-s", "0", words="--session-timeout-s must be > 0"),
    light(*SERVER, "--env", "corridor", "--port", "70000", words="--port must be in [0, 65535]"),
    light(*SERVER, "--env", "corridor", "--port", "{silent_port}", words=("cannot listen on", "--port")),
    light(*SERVER, "--env", "corridor", "--port", "x", words="invalid int value"),
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    returncode: int
    stderr: str
    heavy_imports: list[str]
    ray_started: bool
    left_running: list[int]


# ---------------------------------------------------------------------- the inputs the rows name
def _model_variants(tiny: Path, root: Path) -> dict[str, Path]:
    """Copies of the tiny model, each broken one way."""
    variants = {name: Path(shutil.copytree(tiny, root / name)) for name in
                ("no_weights", "no_tokenizer", "no_template", "truncated", "bad_header")}
    (variants["no_weights"] / "model.safetensors").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (variants["no_tokenizer"] / name).unlink()
    config_file = variants["no_template"] / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    del tokenizer_config["chat_template"]
    config_file.write_text(json.dumps(tokenizer_config))
    for name in ("chat_template.jinja",):
        (variants["no_template"] / name).unlink(missing_ok=True)
    weights = variants["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (variants["bad_header"] / "model.safetensors").write_bytes(b"\xff" * 64)
    return variants


def _damaged_warm_start_entry(tiny: Path, cache: Path) -> None:
    """The cache entry `--model tiny` on frozenlake would warm-start into, with its weights cut short."""
    from rllib_ragen.run.flags import config_from_args
    from rllib_ragen.run.warm_start import warm_start_config
    from run_helpers import driver_args

    from rllib_ragen.models import MARKER_FILE

    args = driver_args("--env", "frozenlake", "--model", str(tiny))
    settings = warm_start_config(config_from_args(args))
    entry = Path(shutil.copytree(tiny, cache / "models" / f"warm-start-{settings.fingerprint(str(tiny))}"))
    (entry / MARKER_FILE).write_text("{}")
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


def _checkpoint_dirs(root: Path) -> dict[str, Path]:
    """A finished run's checkpoint directory, and one whose complete-marked iteration holds no checkpoint."""
    from rllib_ragen.run.checkpoints import COMPLETE_MARKER

    for name, files in (("finished_run", ("rllib_checkpoint.json", "tracking.json")), ("not_a_checkpoint", ("notes.txt",))):
        iteration = root / name / "iter_000005"
        iteration.mkdir(parents=True)
        for file in (COMPLETE_MARKER, *files):
            (iteration / file).write_text("{}")
    return {"finished_run": root / "finished_run", "not_a_checkpoint": root / "not_a_checkpoint"}


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield server.getsockname()[1]


@pytest.fixture(scope="module")
def inputs(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("front_door")
    (root / "a_file").write_text("not a directory")
    (root / "empty").mkdir()
    cache = root / "cache"
    _damaged_warm_start_entry(tiny_model_path, cache)
    paths = {
        "tiny": tiny_model_path,
        "file": root / "a_file",
        "empty_dir": root / "empty",
        **_model_variants(tiny_model_path, root),
        **_checkpoint_dirs(root),
    }
    with _silent_server() as silent_port:
        yield {
            **{name: str(path) for name, path in paths.items()},
            "closed_port": str(free_port()),
            "silent_port": str(silent_port),
            "root": str(root),
            "cache": str(cache),
        }


# ---------------------------------------------------------------------- running the table
class WarmInterpreters:
    """`WARM_POOL` warm interpreters (`warm_interpreter.py`), each running one command at a time."""

    def __init__(self, env: dict[str, str], stderr_dir: Path) -> None:
        self.idle: queue.Queue[subprocess.Popen] = queue.Queue()
        self.processes = []
        for index in range(WARM_POOL):
            stderr = open(stderr_dir / f"warm_{index}.stderr", "w")  # noqa: SIM115 (closed in close())
            process = subprocess.Popen(
                [sys.executable, str(WARM_INTERPRETER)], cwd=ROOT, env=env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            )
            self.processes.append((process, stderr))
        for process, _ in self.processes:
            assert "ready" in json.loads(process.stdout.readline()), "a warm interpreter failed to start"
            self.idle.put(process)

    def run(self, request: dict) -> int:
        process = self.idle.get()
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            return json.loads(process.stdout.readline())["returncode"]
        finally:
            self.idle.put(process)

    def close(self) -> list[str]:
        """Stops them; returns what each wrote to its own stderr (its imports: must be nothing)."""
        written = []
        for process, stderr in self.processes:
            process.stdin.close()
            process.wait(timeout=60)
            stderr.close()
            written.append(Path(stderr.name).read_text())
        return written


def _left_running(marker: str) -> list[int]:
    """Processes still alive whose environment holds `marker` (started by the row, directly or not)."""
    alive = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (proc / "environ").read_bytes().split(b"\0"):
                    alive.append(int(proc.name))
    return alive


def _filled(part: str, inputs: dict[str, str]) -> str:
    for name, value in inputs.items():
        part = part.replace(f"{{{name}}}", value)
    return part


def _run_row(index: int, row: Row, inputs: dict[str, str], warm_pool: WarmInterpreters, base_env: dict) -> Outcome:
    work = Path(tempfile.mkdtemp(prefix=f"row{index}-", dir=inputs["root"]))
    ray_tmp = work / "ray"
    marker = f"FRONT_DOOR_ROW={work.name}"
    env = {**base_env, "RAY_TMPDIR": str(ray_tmp), "FRONT_DOOR_MODULES": str(work / "modules.json"),
           "FRONT_DOOR_ROW": work.name}
    argv = [_filled(part, inputs) for part in row.argv]
    argv = [str(ROOT / argv[0]) if argv[0].endswith(".py") else argv[0], *argv[1:]]
    if row.light:
        done = subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        returncode, stderr = done.returncode, done.stderr
    else:
        returncode = warm_pool.run({"argv": argv, "cwd": str(work), "env": env, "stdout": str(work / "stdout"),
                                    "stderr": str(work / "stderr"), "modules": str(work / "modules.json")})
        stderr = (work / "stderr").read_text()
    modules = json.loads((work / "modules.json").read_text()) if (work / "modules.json").exists() else ["unknown"]
    heavy = modules if row.light else [name for name in modules if name == "vllm"]
    return Outcome(returncode, stderr, heavy, ray_tmp.exists() and any(ray_tmp.iterdir()), _left_running(marker))


@pytest.fixture(scope="module")
def outcomes(inputs: dict[str, str]) -> dict[str, Outcome]:
    """Every row's outcome: the light rows on a small pool of new interpreters, the warm ones on the warm pool."""
    require_extra("openenv", "cpu,test,openenv")
    probe_dir = Path(inputs["root"]) / "probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(IMPORT_PROBE)
    base_env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "PYTHONWARNINGS")}
    base_env.update(PYTHONPATH=os.pathsep.join([str(probe_dir), str(ROOT), os.environ.get("PYTHONPATH", "")]),
                    RLLIB_RAGEN_CACHE=inputs["cache"], HF_HUB_OFFLINE="1")
    warm_pool = WarmInterpreters(base_env, Path(inputs["root"]))
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=WARM_POOL + 2) as pool:
            futures = {row.id: pool.submit(_run_row, index, row, inputs, warm_pool, base_env)
                       for index, row in enumerate(TABLE)}
            results = {row_id: future.result() for row_id, future in futures.items()}
    finally:
        warm_stderr = warm_pool.close()
    assert warm_stderr == [""] * WARM_POOL, f"the warm interpreters' imports wrote to stderr: {warm_stderr}"
    return results


def test_the_table_covers_every_command_with_at_least_60_rows():
    assert len(TABLE) >= 60 and len({row.id for row in TABLE}) == len(TABLE)
    commands = {row.argv[0] if row.argv[0] != "-m" else " ".join(row.argv[1:3]) for row in TABLE}
    for command in (FROZENLAKE, SOKOBAN, BANDIT, COUNTDOWN, OFFLINE, SWEEP, "envs.openenv_server"):
        assert any(command in c for c in commands), command
    for subcommand in ("train", "evaluate", "sweep", "models"):
        assert f"rllib_ragen {subcommand}" in commands, subcommand
    assert {key for key, _, _ in BOUNDS} <= {row.argv[-1].split("=")[0] for row in TABLE}


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
def test_bad_input_is_one_error_line_with_exit_code_2(row: Row, outcomes: dict[str, Outcome]):
    outcome = outcomes[row.id]
    lines = outcome.stderr.splitlines()
    assert outcome.returncode == 2, outcome.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr[-3000:]
    for words in row.words:
        assert words in lines[0], (words, lines[0])
    assert not outcome.ray_started, "Ray was started"
    assert outcome.left_running == [], "processes the command started are still running"
    assert outcome.heavy_imports == [], f"imported {outcome.heavy_imports} before refusing the input"
