"""The analysis notebook runs top to bottom (nbclient, a real kernel) against a
StarPO run the test trains; its helpers read back exactly what was logged."""

from __future__ import annotations

import math

import nbformat
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from nbclient import NotebookClient
from run_helpers import ROOT, driver_args, load_script, tiny_config

from rllib_ragen.run.analysis import (
    ECHO_TRAP_PANELS,
    ECHO_TRAP_SIGNALS,
    EVALUATION_SUCCESS,
    IN_GROUP_STD,
    TRAINING_SECONDS,
    echo_trap_warnings,
    list_runs,
    metric_histories,
    plot_echo_trap,
    plot_evaluation,
    plot_signals,
    read_text_artifact,
    trajectory_pages,
)
from rllib_ragen.run.tracking import MLflowTracker
from rllib_ragen.run.train_loop import run
from rllib_ragen.training.collapse_metrics import EchoTrapSettings

NOTEBOOK = ROOT / "notebooks" / "starpo_runs.ipynb"


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_metric_histories_align_iterations_and_mark_gaps(store):
    tracker = MLflowTracker(tracking_uri=store, experiment="curves")
    tracker.log_metrics({"a": 1.0, "b": 10.0}, step=1)
    tracker.log_metrics({"a": 2.0}, step=2)
    tracker.log_metrics({"a": 3.0, "b": 30.0}, step=3)
    frame = metric_histories(MlflowClient(store), tracker.run_id, ["a", "b", "never"])
    assert list(frame.index) == [1, 2, 3] and list(frame.columns) == ["a", "b", "never"]
    assert list(frame["a"]) == [1.0, 2.0, 3.0]
    assert frame["b"][1] == 10.0 and math.isnan(frame["b"][2]) and frame["b"][3] == 30.0
    assert frame["never"].isna().all()


def test_echo_trap_warnings_replay_the_monitor():
    # Early levels from iterations 1-2: std 1.0, I(X;Z) 0.5 (measured at iteration 1 only).
    # The std is low (< 0.5) from iteration 3 on, 2 in a row warn at 4 and 5; I(X;Z), measured
    # at 3 and 5 (< 0.25 both times), warns at 5. Step 0 (the evaluation before training) is no iteration.
    nan = math.nan
    history = pd.DataFrame(
        {IN_GROUP_STD: [nan, 1.0, 1.0, 0.1, 0.1, 0.1], "collapse/mutual_information": [nan, 0.5, nan, 0.1, nan, 0.05]},
        index=pd.Index(range(6), name="iteration"),
    )
    rule = EchoTrapSettings(baseline_iters=2, patience=2, ratio=0.5)
    flagged = echo_trap_warnings(history, rule)
    assert [(iteration, text.split(":")[0]) for iteration, text in flagged] == [
        (4, "echo trap, reward-variance collapse"), (5, "echo trap, reward-variance collapse"),
        (5, "echo trap, template collapse"),
    ]
    healthy = pd.DataFrame({IN_GROUP_STD: [1.0, 1.0, 0.9, 0.8]}, index=pd.Index(range(1, 5), name="iteration"))
    assert echo_trap_warnings(healthy, rule) == []


def test_list_runs_names_a_missing_experiment(store):
    MLflowTracker(tracking_uri=store, experiment="present")
    with pytest.raises(KeyError, match="no MLflow experiment 'absent'.*present"):
        list_runs(MlflowClient(store), "absent")


def test_plot_signals_draws_one_line_per_run_per_signal(store):
    tracker = MLflowTracker(tracking_uri=store, experiment="plots")
    for step in (1, 2):
        tracker.log_metrics({key: float(step) for key in ECHO_TRAP_SIGNALS.values()}, step=step)
    history = metric_histories(MlflowClient(store), tracker.run_id, list(ECHO_TRAP_SIGNALS.values()))
    figure = plot_signals({"run A": history, "run B": history})
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == list(ECHO_TRAP_SIGNALS)
    assert all(len(ax.get_lines()) == 2 for ax in panels)
    with pytest.raises(ValueError, match="no runs"):
        plot_signals({})


def test_plot_evaluation_draws_success_and_its_interval_band(store):
    tracker = MLflowTracker(tracking_uri=store, experiment="evaluation")
    tracker.log_metrics(dict(zip(EVALUATION_SUCCESS, (0.25, 0.05, 0.6))), step=0)
    tracker.log_metrics({"env_runners/success_rate": 0.5}, step=1)  # an iteration without evaluation
    tracker.log_metrics(dict(zip(EVALUATION_SUCCESS, (0.75, 0.4, 0.95))), step=2)
    history = metric_histories(MlflowClient(store), tracker.run_id, list(EVALUATION_SUCCESS))
    (ax,) = plot_evaluation({"run A": history}).axes
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0, 2] and list(line.get_ydata()) == [0.25, 0.75]
    (band,) = ax.collections
    assert {tuple(xy) for xy in band.get_paths()[0].vertices} >= {(0, 0.05), (0, 0.6), (2, 0.4), (2, 0.95)}


def test_learning_curve_puts_each_evaluation_at_its_minute_of_training(store, tmp_path):
    """Before RL sits at minute 0; later evaluations at RLlib's time_total_s of their iteration, in minutes."""
    learning_curve = load_script(ROOT / "benchmarks" / "learning_curve.py")
    tracker = MLflowTracker(tracking_uri=store, experiment="curve")
    tracker.log_metrics(dict(zip(EVALUATION_SUCCESS, (0.1, 0.05, 0.2))), step=0)
    tracker.log_metrics({TRAINING_SECONDS: 90.0}, step=1)
    tracker.log_metrics({TRAINING_SECONDS: 300.0, **dict(zip(EVALUATION_SUCCESS, (0.4, 0.3, 0.5)))}, step=2)
    history = metric_histories(MlflowClient(store), tracker.run_id, [*EVALUATION_SUCCESS, TRAINING_SECONDS])
    (ax,) = plot_evaluation({"run A": history}, against_minutes=True).axes
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0.0, 5.0] and list(line.get_ydata()) == [0.1, 0.4]
    assert ax.get_xlabel().startswith("minutes")

    output = learning_curve.main(["--tracking-uri", store, "--experiment", "curve", "--output", str(tmp_path / "c.png")])
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(KeyError, match="no MLflow experiment 'missing'"):
        learning_curve.main(["--tracking-uri", store, "--experiment", "missing", "--output", str(tmp_path / "d.png")])


def _log_method_run(store, experiment, *, entropy, spread, finished=True):
    """Evaluation before RL (step 0) and after 2 iterations (4 minutes), entropy and spread at 1 and 2."""
    tracker = MLflowTracker(tracking_uri=store, experiment=experiment)
    tracker.log_metrics({**dict(zip(EVALUATION_SUCCESS, (0.2, 0.1, 0.3))), TRAINING_SECONDS: 0.0}, step=0)
    tracker.log_metrics({TRAINING_SECONDS: 120.0, ECHO_TRAP_PANELS["policy entropy"]: entropy[0],
                         IN_GROUP_STD: spread[0]}, step=1)
    tracker.log_metrics({TRAINING_SECONDS: 240.0, ECHO_TRAP_PANELS["policy entropy"]: entropy[1],
                         IN_GROUP_STD: spread[1], **dict(zip(EVALUATION_SUCCESS, (0.6, 0.5, 0.7)))}, step=2)
    if finished:
        tracker.end()


def test_echo_trap_figure_puts_each_method_on_every_panel_at_its_minute(store, tmp_path, capsys):
    figure_script = load_script(ROOT / "benchmarks" / "echo_trap_figure.py")
    _log_method_run(store, "cpu-learning-frozenlake-expert-starpo-s", entropy=(0.5, 0.4), spread=(0.4, 0.3))
    _log_method_run(store, "cpu-learning-frozenlake-expert-starpo", entropy=(0.5, 0.05), spread=(0.4, 0.0))
    _log_method_run(store, "cpu-learning-frozenlake-expert-crashed", entropy=(1, 1), spread=(1, 1), finished=False)
    output = figure_script.main(["--store", f"frozenlake={store}", "--output", str(tmp_path / "echo.png")])
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "| frozenlake | starpo | 2 | 4.0 | 0.200 -> 0.600 | 0.500 -> 0.050 | 0.400 -> 0.000 |" in table
    assert "| frozenlake | starpo-s | 2 | 4.0 | 0.200 -> 0.600 | 0.500 -> 0.400 | 0.400 -> 0.300 |" in table
    assert "crashed" not in table  # an unfinished run is not drawn

    runs = {"frozenlake": figure_script.env_runs("frozenlake", store)}
    success, entropy, spread = plot_echo_trap(runs).axes
    assert [line.get_label() for line in entropy.get_lines()] == ["starpo", "starpo-s"]
    starpo_entropy = entropy.get_lines()[0]
    assert list(starpo_entropy.get_xdata()) == [2.0, 4.0] and list(starpo_entropy.get_ydata()) == [0.5, 0.05]
    assert list(spread.get_lines()[1].get_ydata()) == [0.4, 0.3]
    assert list(success.get_lines()[0].get_xdata()) == [0.0, 4.0]
    with pytest.raises(ValueError, match="no envs"):
        plot_echo_trap({})
    with pytest.raises(SystemExit) as exit_info:  # one `error:` line naming the form, exit code 2
        figure_script.main(["--store", store, "--output", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2 and "--store takes ENV=URI" in capsys.readouterr().err


@pytest.mark.slow
def test_notebook_runs_top_to_bottom_on_a_real_run(ray_session, tiny_model_path, tmp_path, monkeypatch):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run(tiny_config(tiny_model_path), driver_args(
        "--tracking-uri", store, "--experiment", "notebook", "--checkpoint-dir", str(tmp_path / "ckpt"), stop_iters=2
    ))
    client = MlflowClient(store)
    (run_row,) = list_runs(client, "notebook").itertuples()
    # Step 0 is the evaluation before the first update.
    assert trajectory_pages(client, run_row.run_id) == [
        "trajectories/eval_iter_0000.html", "trajectories/eval_iter_0001.html", "trajectories/eval_iter_0002.html"
    ]
    latest_page = read_text_artifact(client, run_row.run_id, "trajectories/eval_iter_0002.html")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "notebook")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert any(run_row.run_id in page for page in html), "the runs table is missing"
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2, "the evaluation or echo-trap figure is missing"
    assert f"sokoban-starpo ({run_row.run_id[:6]}): no echo-trap warning over 2 iterations" in text
    assert latest_page in html, "the latest trajectory page is not shown"
