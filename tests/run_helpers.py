"""Test helpers: a real MLflow server and a real Ray head node on loopback,
each in its own process group and stopped by that group's id; the tiny
StarPO setup the tracking, sweep and notebook tests train with."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.inference.engine import Completion, InferenceEngine, SamplingParams
from rllib_ragen.run.flags import build_parser

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = str(Path(sys.executable).parent)


def load_script(path: Path):
    """A repository script (a benchmark, a tuned example) imported as a module, to call its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(url: str, *, timeout_s: float, process: subprocess.Popen, headers: dict | None = None) -> None:
    """Polls `url` until it answers 200; fails early if `process` died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server process exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def stop_group(process: subprocess.Popen, *, grace_s: float = 20) -> None:
    """SIGTERM to the process group we started, then SIGKILL what is left of it."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # Children of the group may outlive its leader; take the rest down too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 with a sqlite store and served artifacts; yields its URI."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
    ]
    log = open(root / "server.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", timeout_s=60, process=process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(process)
        log.close()


@contextlib.contextmanager
def ray_head(root: Path, *, env: dict[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """`<venv>/bin/ray start --head --block` on 127.0.0.1 with its own temp dir, ports
    and auth token, the venv NOT on its PATH (as a user who runs `.venv/bin/ray start`),
    plus `env`; yields (dashboard URL, token file). Stopped through its process group,
    i.e. the processes of this head only: `ray stop` would stop every Ray instance of this user."""
    root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    token_file = root / "auth_token"
    token_file.write_text(token)
    dashboard_port = free_port()
    # Ray's socket paths must stay under 107 bytes: pytest's tmp paths are too long.
    ray_temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    command = [
        str(Path(VENV_BIN) / "ray"), "start", "--head", "--block", "--num-cpus", "2",
        "--node-ip-address", "127.0.0.1", "--port", str(free_port()),
        "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
        "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port()),
        "--temp-dir", ray_temp, "--disable-usage-stats",
    ]
    head_env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file), **(env or {}))
    head_env["PATH"] = os.pathsep.join(p for p in head_env.get("PATH", "").split(os.pathsep) if p != VENV_BIN)
    head_env.pop("RAY_ADDRESS", None)
    log = open(root / "ray_start.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=head_env)
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        wait_for_http(f"{url}/api/version", timeout_s=90, process=process, headers=auth_headers(token))
        yield url, token_file
    finally:
        # `ray start --block` itself lingers after SIGTERM; its children are gone by then.
        stop_group(process, grace_s=5)
        log.close()
        shutil.rmtree(ray_temp, ignore_errors=True)


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


README_ENV = "guess_env:GuessEnv"


def write_readme_env(directory: Path) -> str:
    """Writes the README's example env (its "Adding an environment" code block) to
    `directory/guess_env.py`, as a user would; returns its import path."""
    section = (ROOT / "README.md").read_text().split("## Adding an environment", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (directory / "guess_env.py").write_text(code)
    return README_ENV


def tiny_config(model_path: Path | str, *, env: str = "sokoban") -> StarPOConfig:
    """StarPO on the tiny random model: 2 groups x 2, short answers, HF engine, eval every iteration."""
    return (
        StarPOConfig()
        .environment(env)
        .llm(model=str(model_path), critic="head")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(engine="hf")
        .training(mini_batch_size=4, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=1, eval_size=2)
        .debugging(seed=0)
    )


def driver_args(*argv: str, stop_iters: int = 2):
    """The tuned-example flags, parsed (`rllib_ragen.run.train_loop.run` takes them)."""
    parser = build_parser(env="sokoban", description="test", success_threshold=0.0, stop_iters=stop_iters)
    return parser.parse_args(list(argv))


class ForcedAnswerEngine(InferenceEngine):
    """A policy that always answers `answer_ids`, scored by a real engine (log-probs at temperature 1)."""

    def __init__(self, engine: InferenceEngine, answer_ids: list[int]) -> None:
        self.engine, self.answer_ids = engine, list(answer_ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        logprobs = self.engine.score(prompts, [self.answer_ids] * len(prompts))
        return [Completion(list(self.answer_ids), list(lp), "stop") for lp in logprobs]

    def score(self, prompts, continuations):
        return self.engine.score(prompts, continuations)

    def update_weights(self, state_dict) -> None:
        self.engine.update_weights(state_dict)

    def health(self) -> dict:
        return self.engine.health()

    def shutdown(self) -> None:
        self.engine.shutdown()


@contextlib.contextmanager
def small_filesystem(mount_point: Path, *, megabytes: int) -> Iterator[Path]:
    """A tmpfs of `megabytes` MB mounted at `mount_point` (made when missing) for the block, so a test can
    fill a file system; needs root (CI runs as root). Elsewhere the test is skipped, saying why; under CI
    it fails instead."""
    import pytest
    from conftest import running_in_ci

    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(mount_point)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if mounted.returncode != 0:
        reason = f"mounting a {megabytes} MB tmpfs needs root (uid {os.getuid()}): {mounted.stderr.strip()}"
        if running_in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        # Lazily: a process the test killed may still hold a file open there for a moment.
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True, timeout=60)
