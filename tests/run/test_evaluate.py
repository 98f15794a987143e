"""`python -m rllib_ragen.run.evaluate`: a trained tiny-model checkpoint evaluated by
the CLI gives the same trajectories as the training's own evaluation on the same
seeds (one code path, the checkpoint's policy exported exactly), and prints the
table with 95% intervals; bad input is one `error:` line and exit code 2."""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

import pytest
from run_helpers import tiny_config

from rllib_ragen.intervals import format_rate
from rllib_ragen.rollout.evaluation import TABLE_HEADER, table_row
from rllib_ragen.rollout.trajectory_record import turn_record
from rllib_ragen.run.evaluate import build_parser, chosen_envs, main, model_label


@pytest.fixture(scope="module")
def trained(tiny_model_path, ray_session, tmp_path_factory):
    """A checkpoint after one update, and the training's greedy evaluation of it on seeds 123..125."""
    config = tiny_config(tiny_model_path).starpo_evaluation(eval_size=3, eval_temperature=0.0)
    algo = config.build_algo()
    try:
        algo.train()
        stats = algo.evaluate_fixed_seeds()
        episodes = algo.pop_evaluation_episodes()
        checkpoint = algo.save_to_path(str(tmp_path_factory.mktemp("run") / "iter_000001"))
    finally:
        algo.stop()
    responses = [
        turn_record(a, t).response_text for e in episodes for a in e.agent_episodes.values() for t in range(len(a))
    ]
    return checkpoint, stats, list(algo.last_evaluation_outcomes.values()), responses


def test_table_row_shows_the_wilson_interval_computed_by_hand():
    stats = {
        "episode_return_mean": -0.25,
        "valid_action_ratio": 0.5,
        "num_turns_mean": 2.5,
        "response_length_mean": 31.25,
    }
    # 2 of 4: centre (0.5 + z^2/8) / (1 + z^2/4) = 0.5, half-width z*sqrt(1/16 + z^2/64) / (1 + z^2/4) = 0.350.
    assert table_row("sokoban", stats, [1, 0, 0, 1]) == (
        "| sokoban | 4 | 0.500 [0.150, 0.850] | -0.250 | 0.50 | 2.50 | 31.2 |"
    )


def test_checkpoint_evaluation_equals_the_training_evaluation(trained, tmp_path, capsys, monkeypatch, tiny_model_path):
    checkpoint, stats, successes, responses = trained
    out = tmp_path / "out"
    # Named relative to the working directory, as a user types it (RLlib itself needs a URI).
    base = Path(checkpoint).parent.parent
    monkeypatch.chdir(base)
    code = main(
        [
            str(Path(checkpoint).relative_to(base)),
            "--env",
            "sokoban",
            "frozenlake",
            "--temperature",
            "0",
            "--output-dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed

    summary = json.loads((out / "summary.json").read_text())
    sokoban = summary["envs"]["sokoban"]
    assert sokoban["seeds"] == [123, 125] and sokoban["successes"] == successes
    for key in (
        "episode_return_mean",
        "valid_action_ratio",
        "num_turns_mean",
        "response_length_mean",
    ):
        assert sokoban["stats"][key] == pytest.approx(stats[key]), key
    page = (out / "sokoban.html").read_text()
    assert all(html.escape(response) in page for response in responses), "the CLI sampled other answers"
    # The model row names the checkpoint as given and the model inside, not the temporary export.
    label = f"{Path(checkpoint).relative_to(base)}: its policy, trained from {tiny_model_path}"
    assert summary["model"] == label and f"<th>model</th><td>{html.escape(label)}</td>" in page
    assert "evaluate-" not in page
    # Every failed trajectory has its kind, in summary.json and printed.
    assert sum(sokoban["failures"].values()) == 3 - sum(successes)
    assert sokoban["stats"]["failures/dead_box"] == sokoban["failures"]["dead_box"]
    assert "| failure kind | trajectories | share |" in printed

    assert TABLE_HEADER in printed
    rows = [line for line in printed.splitlines() if line.startswith(("| sokoban |", "| frozen"))]
    assert rows[0] == table_row("sokoban", sokoban["stats"], sokoban["successes"])
    assert f"| 3 | {format_rate(successes)} |" in rows[0] and rows[1].startswith("| frozenlake | 3 | 0.")
    assert (out / "frozenlake.html").is_file()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["/no/such/model", "--env", "sokoban"], "/no/such/model"),
        (["{model}", "--env", "sokoban", "--episodes", "0"], "--episodes must be >= 1"),
        (["{model}"], "--env or --generalisation is needed"),
        (["{empty}", "--env", "sokoban"], "neither a Hugging Face model directory"),
        (["{model}", "--env", "nowhere", "--engine", "hf"], "unknown env 'nowhere'"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_code_2(argv, message, tiny_model_path, tmp_path, capsys):
    argv = [a.format(model=tiny_model_path, empty=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--output-dir", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_generalisation_set_leaves_out_envs_this_checkout_lacks(capsys):
    from envs import list_envs

    args = build_parser().parse_args(["policy", "--generalisation"])
    envs = chosen_envs(args, run_env=None)
    assert envs[0] == "sokoban" and {"larger_sokoban", "frozenlake"} <= set(envs)
    if "sokoban_new_vocab" in list_envs():
        assert "sokoban_new_vocab" in envs
    else:
        assert "sokoban_new_vocab not registered" in capsys.readouterr().out
    assert chosen_envs(argparse.Namespace(generalisation=False, env=None), run_env="bandit") == ["bandit"]


def test_a_model_is_labelled_by_what_the_user_gave_and_its_architecture(tiny_model_path, tmp_path, monkeypatch):
    assert model_label(str(tiny_model_path), tiny_model_path) == f"{tiny_model_path}: LlamaForCausalLM"
    monkeypatch.chdir(tiny_model_path.parent)
    assert model_label(tiny_model_path.name, tiny_model_path) == f"{tiny_model_path.name}: LlamaForCausalLM"
    # A model name resolves to a directory elsewhere: both are named.
    assert model_label("tiny", tiny_model_path) == f"tiny ({tiny_model_path}): LlamaForCausalLM"
    assert model_label("empty", tmp_path) == f"empty ({tmp_path})"


def test_failure_counts_reach_mlflow_as_metrics_of_the_evaluation(tmp_path):
    from mlflow import MlflowClient
    from scripted_episodes import ROOM_ENV, scripted_episode

    from rllib_ragen.rollout.evaluation import evaluate_on_seeds
    from rllib_ragen.run.evaluate import Policy, log_to_mlflow

    plays = [([["Right", "Up", "Up"]], 1), ([["Left", "Left"]], 1), ([["Left", "Left"]], 1)]
    episodes = [scripted_episode(ROOM_ENV, answers, max_turns=turns) for answers, turns in plays]
    evaluation = evaluate_on_seeds(lambda **_: episodes, seeds=range(3), temperature=0.0)
    (tmp_path / "out").mkdir()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    policy = Policy("checkpoints/sokoban-starpo", tmp_path, None, "checkpoints/sokoban-starpo: its policy")
    log_to_mlflow(
        policy,
        {"sokoban": evaluation},
        output_dir=tmp_path / "out",
        tracking_uri=uri,
        experiment="evaluations",
        settings={},
    )
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("evaluations").experiment_id])
    failures = {k: v for k, v in run.data.metrics.items() if k.startswith("evaluation/sokoban/failures/")}
    assert failures["evaluation/sokoban/failures/dead_box"] == 1.0
    assert failures["evaluation/sokoban/failures/repeated_no_op"] == 2.0
    assert failures["evaluation/sokoban/failures/env_error"] == 0.0
    assert len(failures) == 1 + 6  # Sokoban's own kind and the six every env shares
