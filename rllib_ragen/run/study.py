"""A study: a Ray Tune experiment that answers one question.

A `Study` declares the question, the envs, the arms (named mappings of setting
names to values, read exactly as `--set KEY=VALUE` reads them, so a declaration
names settings, not the code that holds them), the training seeds (at least 2
per arm), the budget in minutes per trial and the metric: success on the fixed
evaluation seeds. One trial is arm x training seed x env; `trial_configs` builds
and validates every trial's config before Tune starts, so a bad arm fails at
once, with one error naming it.

Running it is `rllib_ragen.run.study_runner`'s, reading it back
`rllib_ragen.run.study_report`'s; the six findings' studies are in
`rllib_ragen.run.findings`. See docs/studies.md.

    Study(
        name="filter-ratio",
        question="Does StarPO-S's variance filter beat no filter?",
        envs=("frozenlake",),
        arms={"no-filter": {"rollout_filter_ratio": 1.0}, "top-quarter": {"rollout_filter_ratio": 0.25}},
        seeds=(0, 1),
        budget_min=12,
    )
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from envs import check_env
from rllib_ragen.algorithm.presets import PRESETS, preset
from rllib_ragen.algorithm.validation import check_seeds_apart
from rllib_ragen.run.settings_flag import apply_settings as apply_assignments
from rllib_ragen.run.settings_flag import setting_value, split_assignment

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig

# Success on the fixed evaluation seeds (`StarPO.evaluate_fixed_seeds`): the metric a study answers with.
EVALUATION_SUCCESS_METRIC = "evaluation/success_rate"
MIN_TRAINING_SEEDS = 2
# MLflow tags of a study's runs.
STUDY_TAG = "rllib_ragen.study"
ARM_TAG = "rllib_ragen.arm"
SEED_TAG = "rllib_ragen.training_seed"
# Names of studies and arms go into Tune trial directories and MLflow tags.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclasses.dataclass(frozen=True)
class Compare:
    """Question: does arm `arm` end at a different success than arm `baseline`, on each env?"""

    arm: str
    baseline: str

    @property
    def text(self) -> str:
        return f"does {self.arm} end above {self.baseline}?"


@dataclasses.dataclass(frozen=True)
class EarlyWarning:
    """Question (RAGEN's finding 3): over every study run in the store, do in-group reward spread and
    entropy fall before success does, and does gradient norm spike before an irreversible collapse?"""

    text: str = "do in-group spread and entropy fall, and grad norm spike, before success collapses?"


Question = Compare | EarlyWarning


@dataclasses.dataclass(frozen=True)
class Study:
    """A Tune experiment that answers one question.

    Args:
        name: The study's name: the Tune experiment's folder and the MLflow tag of its runs.
        question: The question, in words (the report's heading).
        envs: Registered envs (or `module:Class` import paths); each arm runs on each.
        arms: Arm name -> {setting: value}, applied to the preset of each env like `--set`
            (a value may be text, `"1e-5"`, or a Python value, `1e-5`).
        seeds: Training seeds (the run's random seed), at least 2 per arm: the verdict needs
            the spread across them.
        budget_min: Training minutes of a trial; its last iteration evaluates on the fixed seeds.
        settings: Settings of every arm (applied before the arm's).
        questions: The verdict lines' questions (default: each arm against the first arm).
        metric: The success rate on the fixed evaluation seeds the verdicts compare.
        preset: The preset every trial starts from (`rllib_ragen.algorithm.presets`).
        extra_panels: More curves for the figure: panel title -> MLflow metric key.
        arm_warm_starts: Arm name -> {warm-start flag: value} for arms that start from a
            different warm start (the flags' `dest` names, e.g.
            `{"warm_start_world_model_epochs": 1}`); the other arms use the command's flags.
    """

    name: str
    question: str
    envs: Sequence[str]
    arms: Mapping[str, Mapping[str, Any]]
    seeds: Sequence[int] = (0, 1)
    budget_min: float = 15.0
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    questions: Sequence[Question] = ()
    metric: str = EVALUATION_SUCCESS_METRIC
    preset: str = "cpu"
    extra_panels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    arm_warm_starts: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(f"study name {self.name!r} must be letters, digits and _.+- (no spaces or slashes)")
        where = f"study {self.name!r}"
        if not self.question.strip():
            raise ValueError(f"{where}: the question is empty")
        if not self.envs or isinstance(self.envs, str):
            raise ValueError(f"{where}: envs must be a non-empty list of env names, got {self.envs!r}")
        if not self.arms:
            raise ValueError(f"{where}: no arms")
        for arm in self.arms:
            if not NAME.match(arm):
                raise ValueError(f"{where}: arm name {arm!r} must be letters, digits and _.+-")
        if len(set(self.seeds)) < MIN_TRAINING_SEEDS or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"{where}: give at least {MIN_TRAINING_SEEDS} distinct training seeds, got {self.seeds!r}")
        if not self.budget_min > 0:
            raise ValueError(f"{where}: budget_min must be > 0 minutes, got {self.budget_min}")
        if self.metric != EVALUATION_SUCCESS_METRIC:
            raise ValueError(f"{where}: metric must be {EVALUATION_SUCCESS_METRIC!r} (success on the evaluation seeds)")
        if self.preset not in PRESETS:
            raise ValueError(f"{where}: preset must be one of {PRESETS}, got {self.preset!r}")
        if set(self.arm_warm_starts) - set(self.arms):
            raise ValueError(f"{where}: arm_warm_starts names arms it does not declare: {sorted(self.arm_warm_starts)}")
        for question in self.all_questions:
            if isinstance(question, Compare) and {question.arm, question.baseline} - set(self.arms):
                raise ValueError(f"{where}: question {question} names an arm it does not declare: {list(self.arms)}")

    @property
    def all_questions(self) -> tuple[Question, ...]:
        """The declared questions, or each arm against the first."""
        if self.questions:
            return tuple(self.questions)
        baseline, *others = self.arms
        return tuple(Compare(arm, baseline) for arm in others)

    @property
    def num_trials(self) -> int:
        return len(self.arms) * len(self.seeds) * len(self.envs)

    def with_changes(self, **changes: Any) -> Study:
        """A copy with some fields replaced (e.g. a shorter budget for a smoke run), validated again."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TrialPoint:
    """One trial: an arm, a training seed and an env of a study (`index`: its place in the study)."""

    study: str
    arm: str
    seed: int
    env: str
    index: int

    @property
    def label(self) -> str:
        return f"{self.arm}_seed{self.seed}_{self.env.replace(':', '-')}"


def trial_points(study: Study) -> list[TrialPoint]:
    """Every trial, env by env and seed by seed, the arms alternating: a study stopped early
    has the same number of trials of each arm, give or take one."""
    combos = [(env, seed, arm) for env in study.envs for seed in study.seeds for arm in study.arms]
    return [TrialPoint(study.name, arm, seed, env, index) for index, (env, seed, arm) in enumerate(combos)]


def trial_configs(study: Study, *, overrides: Sequence[str] = ()) -> list[StarPOConfig]:
    """The config of every trial (`trial_points` order), each validated: the preset of its env, the
    study's settings, `overrides` (`--set KEY=VALUE` texts, for every trial), its arm, its seed.

    Raises:
        ValueError: naming the study, the arm or env and the setting, for the first bad one (an
            unknown setting, a value of the wrong type, a config StarPO refuses, evaluation seeds
            that training would also play, an override of a setting an arm varies).
    """
    check_overrides(study, overrides)
    configs = []
    for point in trial_points(study):
        where = f"study {study.name!r} arm {point.arm!r} on {point.env}"
        try:
            config = preset(study.preset, point.env)
            apply_settings(config, study.settings, source=f"study {study.name!r} settings:")
            apply_assignments(config, overrides)
            apply_settings(config, study.arms[point.arm], source=f"arm {point.arm!r}:")
            config.debugging(seed=point.seed)
            config.validate_starpo()
            check_env(config.env, in_other_processes=True)
            check_seeds_apart(config, iterations=None)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{where}: {error}") from error
        configs.append(config)
    return configs


def apply_settings(config: StarPOConfig, settings: Mapping[str, Any], *, source: str) -> None:
    """Sets the settings together as `--set KEY=VALUE`s would (a non-text value is read from its repr)."""
    values = {}
    for key, value in settings.items():
        raw = value if isinstance(value, str) else repr(value)
        try:
            split_assignment(config, f"{key}={raw}", flag=source)
        except ValueError:
            raise ValueError(f"{source} unknown setting {key!r}") from None
        values[key] = setting_value(config, key, raw, flag=source)
    config.update_from_dict(values)


def check_overrides(study: Study, overrides: Sequence[str]) -> None:
    """Refuses an override of a setting an arm varies: it would erase the difference the study measures."""
    varied = {key for arm in study.arms.values() for key in arm}
    for assignment in overrides:
        key = assignment.partition("=")[0]
        if key in varied:
            raise ValueError(f"--set {assignment}: {key!r} is what the arms of study {study.name!r} vary; drop it")
