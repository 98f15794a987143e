"""OpenEnv: a StarPO env served by `python -m envs.openenv_server` (a real server process on
loopback, stopped by its pid) and played by URL through `openenv:<url>`: the same episodes as
the local env, replay after a dropped connection, bounded waits with errors naming the server,
bad input refused, sessions released; and StarPO training against it, through a server killed
mid-run and restarted."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_extra
from run_helpers import ROOT, ForcedAnswerEngine, driver_args, free_port, stop_group, tiny_config, wait_for_http

from envs import check_env, make_env
from envs.base import DYNAMICS_STREAM

require_extra("openenv", "cpu,test,openenv")

from envs import openenv_server as server_command  # noqa: E402 (after the extra's check)
from envs.openenv_client import OpenEnvServerError  # noqa: E402
from rllib_ragen.rollout.env_group import EnvGroup, TurnBudgetSettings  # noqa: E402

# A server env whose step never returns: a server that accepts a step and hangs.
SLEEPY_ENV = """
import time

from envs.corridor import CorridorEnv


class SleepyEnv(CorridorEnv):
    def _step(self, action):
        time.sleep(3600)
"""


@contextlib.contextmanager
def openenv_server(log_dir: Path, *args: str, port: int | None = None, path: str = "") -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m envs.openenv_server *args` on 127.0.0.1 in its own process group; yields (URL, process)."""
    port = port or free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), path) if p))
    log = open(log_dir / f"server_{port}.log", "ab")
    command = [sys.executable, "-m", "envs.openenv_server", *args, "--port", str(port)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/health", timeout_s=120, process=process)
        yield url, process
    finally:
        stop_group(process, grace_s=5)
        log.close()


def kill(process: subprocess.Popen) -> None:
    """SIGKILL to the server by its pid: no shutdown, its connections just drop."""
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def play(env, seed: int, actions: list[str], options: dict | None = None) -> list:
    outcomes = [env.reset(seed=seed, options=options)]
    for action in actions:
        outcomes.append(env.step(action))
        if outcomes[-1][2] or outcomes[-1][3]:
            break
    return outcomes


ACTIONS = ["Up", "Left", "jump", "Down", "Right", "Down", "Right", "Down", "Right"]


def test_served_env_plays_as_the_local_env_for_the_same_seed(tmp_path):
    with openenv_server(tmp_path, "--env", "frozenlake", "--set", "size=5") as (url, _):
        remote, local = make_env(f"openenv:{url}"), make_env("frozenlake", size=5)
        assert remote.instructions == local.instructions and remote.action_vocabulary == local.action_vocabulary
        # Slippery ice: the dynamics stream (a reset option) reaches the server's env too.
        for seed, options in ((3, None), (3, {DYNAMICS_STREAM: 1}), (11, {DYNAMICS_STREAM: 2})):
            assert play(remote, seed, ACTIONS, options) == play(local, seed, ACTIONS, options)
        remote.close()


def test_a_dropped_connection_is_replayed_and_the_trajectory_goes_on(tmp_path):
    port = free_port()
    local = make_env("corridor")
    with openenv_server(tmp_path, "--env", "corridor", port=port) as (url, first):
        remote = make_env(f"openenv:{url}")
        assert play(remote, 5, ["Right", "Left"]) == play(local, 5, ["Right", "Left"])
        kill(first)
    # A new server knows nothing of the episode: the client replays it (reset, Right, Left) first.
    with openenv_server(tmp_path, "--env", "corridor", port=port) as (_, second):
        assert remote.step("Right") == local.step("Right")
        kill(second)
    # A server whose env differs cannot reproduce the episode: an error, not a silently other episode.
    with openenv_server(tmp_path, "--env", "corridor", "--set", "distance=5", port=port):
        with pytest.raises(OpenEnvServerError, match=r"replaying the episode .* is not a pure function of seed"):
            remote.step("Right")
        remote.close()


def test_an_unreachable_server_fails_with_an_error_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    env = make_env(f"openenv:{url}", timeout_s=2, retries=1, backoff_s=0)
    with pytest.raises(OpenEnvServerError, match=rf"{url}.*reset failed .*gave up on reset after 2 attempts"):
        env.reset(seed=0)
    with pytest.raises(OpenEnvServerError, match=rf"GET {url}/text_env failed"):
        _ = env.instructions


def test_a_server_that_never_answers_the_handshake_times_out_naming_it():
    with socket.socket() as listener:  # accepts connections, never says a word
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        env = make_env(f"openenv:{url}", timeout_s=1, retries=0)
        with pytest.raises(OpenEnvServerError, match=rf"{url}: reset failed \(timeout 1 s\).*gave up on reset after 1"):
            env.reset(seed=0)


def test_a_step_the_server_never_answers_times_out_naming_it(tmp_path):
    (tmp_path / "sleepy_env.py").write_text(SLEEPY_ENV)
    with openenv_server(tmp_path, "--env", "sleepy_env:SleepyEnv", path=str(tmp_path)) as (url, _):
        env = make_env(f"openenv:{url}", timeout_s=5, retries=1, backoff_s=0)
        env.reset(seed=0)
        # The second attempt replays the reset on a new connection, then waits for the step's answer in vain too.
        with pytest.raises(OpenEnvServerError, match=r"step \{'message': 'Right'\} failed \(timeout 5 s\): TimeoutError: no answer within 5 s") as error:
            env.step("Right")
        assert "gave up on step 'Right' after 2 attempts" in str(error.value)
        env.close()


def test_bad_input_gets_a_clear_error(tmp_path):
    for name in ("openenv:127.0.0.1:8000", "openenv:ftp://host", "openenv:"):
        with pytest.raises(ValueError, match="an OpenEnv server URL looks like http://127.0.0.1:8000"):
            check_env(name)
    url = "http://127.0.0.1:9"
    for key, value, message in (
        ("timeout_s", 0, "timeout_s must be > 0"),
        ("retries", -1, "retries must be an int >= 0"),
        ("backoff_s", -1, "backoff_s must be >= 0"),
        ("action_field", "", "action_field must be a non-empty string"),
    ):
        with pytest.raises(ValueError, match=message):
            make_env(f"openenv:{url}", **{key: value})
    with pytest.raises(TypeError, match=r"does not accept config key\(s\) \['timeout'\]; accepted keys: \['url', 'timeout_s'"):
        make_env(f"openenv:{url}", timeout=3)
    with openenv_server(tmp_path, "--env", "corridor") as (url, _):
        # The server's env refuses the option: its answer names it, and it is not retried.
        with pytest.raises(OpenEnvServerError, match=r"failed reset: Server error: Corridor takes no reset options") as error:
            make_env(f"openenv:{url}").reset(seed=0, options={"colour": "red"})
        assert "attempts" not in str(error.value)
        with pytest.raises(OpenEnvServerError, match=r"without the text field 'state' \(its fields: \['action_is_valid'"):
            make_env(f"openenv:{url}", observation_field="state").reset(seed=0)
        with pytest.raises(OpenEnvServerError, match=rf"failed step \{{'command': 'Right'\}}: .*VALIDATION_ERROR.*{url}/schema"):
            env = make_env(f"openenv:{url}", action_field="command")
            env.reset(seed=0)
            env.step("Right")


def test_the_server_command_documents_its_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        server_command.main(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    for flag in ("--env", "--set KEY=VALUE", "--host", "--port", "--max-sessions", "--session-timeout-s"):
        assert flag in usage, flag


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "no_such_env"], "cannot serve env 'no_such_env': unknown env 'no_such_env'"),
        (["--env", "corridor", "--set", "distance"], "--set takes KEY=VALUE, got 'distance'"),
        (["--env", "corridor", "--set", "colour=red"], "does not accept config key(s) ['colour']"),
        (["--env", "corridor", "--max-sessions", "0"], "--max-sessions must be >= 1, got 0"),
    ],
)
def test_the_server_command_refuses_bad_arguments_naming_them(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:  # before serving anything
        server_command.main(argv)
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2 and message in stderr, stderr


def test_env_groups_release_their_server_sessions_when_closed(tmp_path):
    budget = TurnBudgetSettings(max_turns=2)
    with openenv_server(tmp_path, "--env", "corridor", "--max-sessions", "2") as (url, _):
        for seed in range(3):  # three groups of two, one after the other, on a server of two sessions
            group = EnvGroup(f"openenv:{url}", group_size=2, budget=budget)
            observations, _ = group.reset(seed=seed)
            assert sorted(observations) == ["traj_0", "traj_1"], group.errors
            group.close()
        # Without a close the sessions stay taken: the server refuses a third one.
        held = [make_env(f"openenv:{url}", retries=1, backoff_s=0) for _ in range(3)]
        held[0].reset(seed=0)
        held[1].reset(seed=0)
        with pytest.raises(OpenEnvServerError, match=r"Server at capacity: 2/2 sessions .*CAPACITY_REACHED"):
            held[2].reset(seed=0)
        for env in held:
            env.close()


class _KillsTheServerOnTurn2(ForcedAnswerEngine):
    """Answers "Right" every turn, and SIGKILLs the server before the second turn's answers."""

    def __init__(self, engine, answer_ids, server: subprocess.Popen) -> None:
        super().__init__(engine, answer_ids)
        self.server, self.calls = server, 0

    def generate(self, prompts, params):
        self.calls += 1
        if self.calls == 2:
            kill(self.server)
        return super().generate(prompts, params)


@pytest.mark.slow  # three driver runs and a training iteration against a server process
def test_training_against_a_server_killed_mid_run_then_restarted_resumes(ray_session, tiny_model_path, tiny_tokenizer, tmp_path):
    from rllib_ragen.run.checkpoints import checkpoint_iteration, latest_checkpoint
    from rllib_ragen.run.train_loop import run

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = (
        tiny_config(tiny_model_path)
        .environment(f"openenv:{url}", env_config={"timeout_s": 5, "retries": 1, "backoff_s": 0.1})
        .starpo_evaluation(eval_interval=0)  # the iteration with the server gone ends in its rollout
    )
    flags = ("--no-warm-start", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--checkpoint-dir", str(tmp_path / "ckpt"))
    with openenv_server(tmp_path, "--env", "corridor", port=port) as (_, server):
        result = run(config, driver_args(*flags, stop_iters=2))
        assert result["training_iteration"] == 2 and result["env_runners"]["env_errors"] == 0
        assert checkpoint_iteration(latest_checkpoint(tmp_path / "ckpt")) == 2

        # Killed mid-rollout (after every trajectory's first step): each of the 2 x 2 trajectories
        # ends faulted, the iteration trains on what they did before, and nothing hangs.
        algo = config.build_algo()
        try:
            runner = algo.env_runner
            answer = tiny_tokenizer.encode("<think>ok</think><answer>Right</answer>", add_special_tokens=False)
            runner.engine = _KillsTheServerOnTurn2(runner.engine, answer + [runner.protocol.stop_token_ids[0]], server)
            killed = algo.train()
            assert server.poll() is not None and killed["env_runners"]["env_errors"] == 4
            # No group is lost: both are in the batch, their trajectories cut at the fault.
            assert killed["env_runners"]["num_trajectories"] == 4
            assert killed["learners"]["default_policy"]["num_trained_tokens"] > 0
            # With the server gone no group can start: a clear error naming it, not a hang.
            with pytest.raises(RuntimeError, match=rf"no group of env .*{url}.*reset failed .*gave up on reset after 2"):
                algo.train()
        finally:
            algo.stop()

    with openenv_server(tmp_path, "--env", "corridor", port=port):  # restarted on the same port
        resumed = run(config, driver_args(*flags, "--resume", stop_iters=3))
    assert resumed["training_iteration"] == 3 and resumed["env_runners"]["env_errors"] == 0
    assert checkpoint_iteration(latest_checkpoint(tmp_path / "ckpt")) == 3
