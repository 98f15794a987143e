"""Studies: the declaration's checks, each trial's config built as `--set` builds it and refused
before Tune starts when bad, Tune's grid giving each trial its own config, the budget rule, and
the six findings' studies valid on the CPU preset."""

from __future__ import annotations

import dataclasses
import math

import pytest
from mlflow.tracking import MlflowClient
from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial
from ray.tune.search.variant_generator import generate_variants
from run_helpers import ROOT

from rllib_ragen.run.callbacks import MLflowSettings, with_mlflow
from rllib_ragen.run.findings import FINDINGS, find_study
from rllib_ragen.run.study import ARM_TAG, SEED_TAG, STUDY_TAG, Compare, Study, trial_configs, trial_points
from rllib_ragen.run.study_cli import main as study_main
from rllib_ragen.run.study_runner import (
    TRIAL_ENTRY,
    CloseFailedRuns,
    finished_trial_run,
    param_space,
    trial_finished,
)
from rllib_ragen.run.tracking import TRIAL_TAG, MLflowTracker


def _study(**changes) -> Study:
    fields = dict(
        name="lr",
        question="Does a larger step end higher?",
        envs=("frozenlake", "sokoban"),
        arms={"small": {"actor_lr": "1e-5"}, "large": {"actor_lr": 1e-4, "rollout_filter_ratio": 0.5}},
        seeds=(0, 1),
        budget_min=3,
    )
    return Study(**{**fields, **changes})


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(seeds=(0,)), "at least 2 distinct training seeds"),
        (dict(seeds=(1, 1)), "at least 2 distinct training seeds"),
        (dict(name="my study"), "study name 'my study'"),
        (dict(arms={}), "no arms"),
        (dict(arms={"a b": {}}), "arm name 'a b'"),
        (dict(budget_min=0), "budget_min must be > 0"),
        (dict(envs="sokoban"), "envs must be a non-empty list"),
        (dict(questions=(Compare("large", "medium"),)), "names an arm it does not declare"),
        (dict(metric="env_runners/success_rate"), "metric must be 'evaluation/success_rate'"),
    ],
)
def test_a_bad_declaration_is_named(changes, message):
    with pytest.raises(ValueError, match=message):
        _study(**changes)


def test_trials_alternate_arms_within_each_seed_and_env():
    points = trial_points(_study())
    assert [(p.env, p.seed, p.arm) for p in points[:4]] == [
        ("frozenlake", 0, "small"),
        ("frozenlake", 0, "large"),
        ("frozenlake", 1, "small"),
        ("frozenlake", 1, "large"),
    ]
    assert [p.index for p in points] == list(range(8)) and _study().num_trials == 8
    assert _study().all_questions == (Compare("large", "small"),)


def test_each_trial_is_its_envs_preset_with_the_arm_read_as_set_reads_it():
    configs = trial_configs(_study(), overrides=["eval_size=16"])
    by_point = dict(zip(((p.env, p.seed, p.arm) for p in trial_points(_study())), configs))
    small, large = by_point[("sokoban", 1, "small")], by_point[("sokoban", 1, "large")]
    assert small.optim.actor_lr == 1e-5 and isinstance(small.optim.actor_lr, float)  # the text "1e-5", as --set reads it
    assert large.optim.actor_lr == 1e-4 and large.group_filter.rollout_filter_ratio == 0.5 and small.group_filter.rollout_filter_ratio == 0.25
    assert small.seed == 1 and by_point[("sokoban", 0, "small")].seed == 0
    assert small.starpo_eval.eval_size == 16 and small.turn_budget.max_turns == 8 and by_point[("frozenlake", 1, "small")].turn_budget.max_turns == 5


@pytest.mark.parametrize(
    "arms,overrides,message",
    [
        ({"a": {}, "b": {"actor_lr_": 1e-4}}, [], r"arm 'b' on frozenlake: arm 'b': unknown setting 'actor_lr_'"),
        ({"a": {}, "b": {"group_size": 4.5}}, [], r"arm 'b'.*group_size takes int \(an integer\), got '4.5'"),
        ({"a": {}, "b": {"group_size": 0}}, [], r"arm 'b' on frozenlake: .*group_size"),
        ({"a": {"actor_lr": 1e-5}, "b": {}}, ["actor_lr=1e-3"], "'actor_lr' is what the arms of study 'lr' vary"),
        ({"a": {}, "b": {}}, ["eval_seed=9990", "eval_size=20"], "evaluation seeds 9990..10009 overlap the training"),
    ],
)
def test_a_bad_arm_is_refused_with_one_error_naming_it(arms, overrides, message):
    with pytest.raises(ValueError, match=message):
        trial_configs(_study(arms=arms), overrides=overrides)


def test_a_bad_arm_stops_the_command_before_ray_or_tune(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad_study.py").write_text(
        "from rllib_ragen.run.study import Study\n"
        "STUDY = Study(name='bad', question='q?', envs=('bandit',), arms={'a': {}, 'b': {'group_sise': 4}})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        study_main(["bad_study:STUDY"])
    assert stopped.value.code == 2
    assert "error: study 'bad' arm 'b' on bandit: arm 'b': unknown setting 'group_sise'" in capsys.readouterr().err
    assert not (tmp_path / "studies").exists() and not (tmp_path / "mlflow.db").exists()


def test_tunes_grid_gives_every_trial_its_own_config():
    study = _study()
    configs = trial_configs(study)
    space = param_space(study, configs, MLflowSettings(tracking_uri="sqlite:////nonexistent/mlflow.db"))
    resolved = [config for _, config in generate_variants(space)]
    assert sorted(config[TRIAL_ENTRY]["index"] for config in resolved) == list(range(study.num_trials))
    for config in resolved:
        point, expected = config[TRIAL_ENTRY], configs[config[TRIAL_ENTRY]["index"]]
        assert (point["arm"], point["seed"], point["env"]) == (
            "small" if expected.optim.actor_lr == 1e-5 else "large",
            expected.seed,
            expected.env,
        )
        for key in ("actor_lr", "rollout_filter_ratio", "seed", "env", "max_turns", "env_config"):
            assert config[key] == expected.to_dict()[key], key
        assert point["budget_s"] == 180.0


def test_a_trial_ends_at_an_evaluation_after_its_budget():
    evaluated, not_evaluated = {"success_rate": 0.5}, {"success_rate": math.nan}
    assert not trial_finished({"time_total_s": 200.0, "evaluation": not_evaluated}, 180.0)
    assert not trial_finished({"time_total_s": 200.0}, 180.0)
    assert not trial_finished({"time_total_s": 100.0, "evaluation": evaluated}, 180.0)
    assert trial_finished({"time_total_s": 180.0, "evaluation": evaluated}, 180.0)


def test_the_six_findings_studies_are_valid_on_the_cpu_preset():
    assert {name.split("-")[0] for name in FINDINGS} == {
        "finding1", "finding2", "finding3", "finding5", "finding6", "world", "noop", "box", "rl"  # 2 and 4 share one
    }
    for study in FINDINGS.values():
        configs = trial_configs(study)
        assert len(configs) == study.num_trials and len(set(study.seeds)) >= 2
    moves = trial_configs(FINDINGS["finding5-moves"])
    assert sorted({c.protocol.max_actions_per_turn for c in moves}) == [1, 2, 3] and {c.env for c in moves} == {"sokoban"}
    groups = trial_configs(FINDINGS["finding5-groups"])
    assert {c.rollout.n_groups * c.rollout.group_size for c in groups} == {64}


def test_an_arms_warm_start_flags_reach_only_that_arms_warm_start(monkeypatch):
    """The world-model study: its second arm's warm start has the stage, the first arm's does not."""
    from rllib_ragen.run import study_cli, warm_start

    study = FINDINGS["world-model-warm-start"].with_changes(envs=("frozenlake",))
    built = []
    monkeypatch.setattr(warm_start, "warm_start", lambda model, ws, **_: built.append(ws) or f"model-{len(built)}")
    flags = study_cli.build_parser("study").parse_args([study.name])
    configs = trial_configs(study)
    study_cli.start_from_warm_starts(study, configs, flags)
    assert [ws.world_model_epochs for ws in built] == [0, 1]  # one build per arm, the seeds share it
    assert [c.llm_module.model for c in configs] == ["model-1", "model-2"] * len(study.seeds)
    with pytest.raises(ValueError, match="arm_warm_starts names arms it does not declare"):
        study.with_changes(arm_warm_starts={"no-such-arm": {}})


def _shows_the_note(env) -> bool:
    for move in ("Up", "Up", "Up", "Up"):  # four moves one way: the last ones meet an edge or a wall
        obs, *_ = env.step(move)
    return "Your last move, Up, changed nothing" in obs


def _shows_the_box_sides(env) -> bool:
    return "\nNext to the box: " in env.render_text()


@pytest.mark.parametrize(
    ("name", "option", "shows"),
    [("noop-note", "note_no_effect", _shows_the_note), ("box-sides", "describe_box_sides", _shows_the_box_sides)],
)
def test_an_env_option_arm_plays_and_warm_starts_on_its_own_render(monkeypatch, name, option, shows):
    """The noop-note and box-sides studies: the arm with the env option plays the preset's env with it
    (training and evaluation play `env_config`), and its warm start, built from that env_config, is its own
    and shows the option's text; the other arm is the preset as it is, with the preset's warm start."""
    from envs import make_env
    from rllib_ragen.algorithm.presets import preset
    from rllib_ragen.run import study_cli, warm_start

    study = FINDINGS[name]
    built = []
    monkeypatch.setattr(warm_start, "warm_start", lambda model, ws, **_: built.append(ws) or f"model-{len(built)}")
    configs = trial_configs(study)
    study_cli.start_from_warm_starts(study, configs, study_cli.build_parser("study").parse_args([study.name]))
    assert [(ws.env, ws.env_config.get(option)) for ws in built] == [
        (env, value) for env in study.envs for value in (None, True)
    ]
    for env, (off, on) in zip(study.envs, zip(built[::2], built[1::2])):
        tuned = preset("cpu", env)
        assert off == warm_start.warm_start_config(tuned)  # the tuned settings' own warm start
        assert on == dataclasses.replace(off, env_config={**tuned.env_config, option: True})
        assert on.fingerprint("m") != off.fingerprint("m")
        played, plain = make_env(on.env, **on.env_config), make_env(off.env, **off.env_config)
        played.reset(seed=on.first_seed)
        plain.reset(seed=on.first_seed)
        assert shows(played) and not shows(plain)
    for point, config in zip(trial_points(study), configs):
        assert config.env_config == {**preset("cpu", point.env).env_config, **study.arms[point.arm].get("env_config", {})}


def test_envs_flag_runs_a_subset_of_the_studys_envs_and_refuses_others():
    from rllib_ragen.run.study_cli import only_envs

    study = FINDINGS["finding5-freshness"]
    assert only_envs(study, ["sokoban", "sokoban"]) == ["sokoban"]
    with pytest.raises(ValueError, match=r"--envs bandit: study 'finding5-freshness' runs only \['frozenlake', 'sokoban'\]"):
        only_envs(study, ["bandit"])


def test_find_study_names_what_exists():
    assert find_study("finding1-critic") is FINDINGS["finding1-critic"]
    with pytest.raises(ValueError, match="no study 'finding9'"):
        find_study("finding9")
    with pytest.raises(ValueError, match="rllib_ragen.run.findings:SEEDS is a tuple, not a Study"):
        find_study("rllib_ragen.run.findings:SEEDS")


def test_the_readmes_study_is_valid_and_under_ten_lines(tmp_path, monkeypatch):
    section = (ROOT / "README.md").read_text().split("A study of your own", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) < 10
    (tmp_path / "my_studies.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    study = find_study("my_studies:LR")
    configs = trial_configs(study)
    assert [c.optim.actor_lr for c in configs] == [5e-5, 1e-4, 5e-5, 1e-4] and [c.seed for c in configs] == [0, 0, 1, 1]


def test_a_failed_trials_run_is_closed_failed_and_a_finished_one_left_alone(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = MLflowSettings(tracking_uri=store, experiment="studies")
    storage = StorageContext(storage_path=str(tmp_path / "tune"), experiment_dir_name="lr")
    runs = {}
    for name in ("failed", "finished"):
        runs[name] = MLflowTracker(tracking_uri=store, experiment="studies", tags={TRIAL_TAG: f"{name}_dir"})
        trial = Trial("StarPO", config={}, stub=True, storage=storage, trial_id=name)
        trial.storage.trial_dir_name = f"{name}_dir"
        if name == "finished":
            runs[name].end("FINISHED")
        CloseFailedRuns(settings).on_trial_error(0, [trial], trial)
    client = MlflowClient(store)
    assert client.get_run(runs["failed"].run_id).info.status == "FAILED"
    assert client.get_run(runs["finished"].run_id).info.status == "FINISHED"



def test_a_trial_finds_only_its_own_finished_run(tmp_path):
    """Tune may start again a trial that finished just before a kill; it keeps the trial only when
    MLflow holds a FINISHED run of that study, arm, seed and env."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = with_mlflow(trial_configs(_study())[1], MLflowSettings(tracking_uri=store, experiment="studies"))
    point = {**dataclasses.asdict(trial_points(_study())[1]), "budget_s": 180.0}
    setattr(config, TRIAL_ENTRY, point)  # as Tune's grid gives it
    assert (point["arm"], point["seed"], point["env"], config.env) == ("large", 0, "frozenlake", "frozenlake")

    def run(status: str, **changes: str) -> str:
        tags = {STUDY_TAG: "lr", ARM_TAG: "large", SEED_TAG: "0", "env": "frozenlake", **changes}
        tracker = MLflowTracker(tracking_uri=store, experiment="studies", tags=tags)
        tracker.end(status)
        return tracker.run_id

    assert finished_trial_run(config) is None  # no experiment yet
    for other in ({ARM_TAG: "small"}, {SEED_TAG: "1"}, {"env": "sokoban"}, {STUDY_TAG: "lr2"}):
        run("FINISHED", **other)
    run("FAILED")
    assert finished_trial_run(config) is None
    finished = run("FINISHED")
    run("KILLED")  # a later attempt's leftover does not hide the finished run
    assert finished_trial_run(config) == finished
