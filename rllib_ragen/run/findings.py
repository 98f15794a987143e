"""The studies of RAGEN's six findings (arXiv 2504.20073), on the CPU preset of each env's readable
variant (SmolLM2-135M after the expert's warm start, GRPO, one move a turn, 16 groups x 4 of which
StarPO-S trains the quarter whose rewards disagree most). Each is `rllib-ragen study NAME`.

They live in the package, not in a folder beside it, so that `rllib-ragen study NAME` finds them
from any working directory and any install; a user's own study is a `Study` in a module of their
own, run as `rllib-ragen study my_module:MY_STUDY`.

Budgets: 12 training minutes a trial on FrozenLake, 15 on Sokoban (the echo-trap runs' budgets,
docs/results/echo_trap.md): long enough for several evaluations, short enough for a study of
6-16 trials to finish within a few hours on 2 cores.
"""

from __future__ import annotations

import importlib

from rllib_ragen.run.study import Compare, EarlyWarning, Study

GRID_ENVS = ("frozenlake", "sokoban")
SEEDS = (0, 1)
# Training minutes a trial: the env's (a study on both envs takes the longer).
BUDGET_MIN = {"frozenlake": 12.0, "sokoban": 15.0}
BOTH_ENVS_BUDGET = max(BUDGET_MIN.values())

CRITIC = Study(
    name="finding1-critic",
    question="Does a PPO critic (GAE, or bi-level GAE over turns) make multi-turn RL steadier than GRPO?",
    envs=GRID_ENVS,
    arms={
        "grpo": {"advantage_estimator": "grpo", "critic": "none"},
        "ppo-gae": {"advantage_estimator": "gae", "critic": "head"},
        "ppo-bi-level-gae": {"advantage_estimator": "bi_level_gae", "critic": "head"},
    },
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
)

# StarPO: every sampled group trained, PPO's symmetric clip. StarPO-S: the groups whose rewards disagree
# most (the preset keeps a quarter), clip-higher (0.28 above, as the preset). KL is off in both (the preset).
# With one on-policy update a batch (the CPU preset) every ratio is 1 and no clip binds, so `starpo` and
# `starpo-s-keep-1.0` are the same run there (docs/results/study_finding2_4_filter.md); the clips differ on presets that
# update several times a batch.
FILTER = Study(
    name="finding2-4-filter",
    question="Does StarPO-S's uncertainty filter (keep 0.25 / 0.5 / 1.0 of the groups) beat StarPO?",
    envs=GRID_ENVS,
    arms={
        "starpo": {"rollout_filter_ratio": 1.0, "clip_ratio_high": 0.2},
        "starpo-s-keep-1.0": {"rollout_filter_ratio": 1.0},
        "starpo-s-keep-0.5": {"rollout_filter_ratio": 0.5},
        "starpo-s-keep-0.25": {"rollout_filter_ratio": 0.25},
    },
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
    questions=(
        Compare("starpo-s-keep-0.25", "starpo"),
        Compare("starpo-s-keep-0.5", "starpo-s-keep-1.0"),
        Compare("starpo-s-keep-0.25", "starpo-s-keep-1.0"),
    ),
)

# Collapse on purpose: the preset's step size and 10x and 40x it. The early-warning question reads every
# finished study run of the store, so the other studies' runs count too.
EARLY_WARNING = Study(
    name="finding3-early-warning",
    question="Do in-group reward spread and entropy fall, and grad norm spike, before success collapses?",
    envs=("frozenlake",),
    arms={"lr-5e-5": {"actor_lr": 5e-5}, "lr-5e-4": {"actor_lr": 5e-4}, "lr-2e-3": {"actor_lr": 2e-3}},
    seeds=SEEDS,
    budget_min=BUDGET_MIN["frozenlake"],
    questions=(EarlyWarning(), Compare("lr-2e-3", "lr-5e-5")),
)

# 64 trajectories sampled an iteration and 16 trained in each arm (the filter keeps a quarter of the groups).
GROUPS = Study(
    name="finding5-groups",
    question="At 64 trajectories an iteration, do more initial states (groups) beat more tries of each?",
    envs=GRID_ENVS,
    arms={
        "16x4": {"n_groups": 16, "group_size": 4},
        "8x8": {"n_groups": 8, "group_size": 8},
        "4x16": {"n_groups": 4, "group_size": 16},
    },
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
    questions=(Compare("16x4", "4x16"), Compare("8x8", "4x16")),
)

# The same 8 moves a trajectory; an answer of 3 moves needs more than the preset's 12 tokens.
MOVES = Study(
    name="finding5-moves",
    question="On Sokoban, do 2 or 3 moves a turn beat 1 (RAGEN's Table 3: 1 is the weakest)?",
    envs=("sokoban",),
    arms={
        "1-move": {"max_actions_per_turn": 1},
        "2-moves": {"max_actions_per_turn": 2},
        "3-moves": {"max_actions_per_turn": 3},
    },
    seeds=SEEDS,
    budget_min=BUDGET_MIN["sokoban"],
    settings={"response_length": 24},
)

FRESHNESS = Study(
    name="finding5-freshness",
    question="Do up-to-date rollouts (1 update a batch) beat reusing a batch for 2 or 4 updates?",
    envs=GRID_ENVS,
    arms={
        "every-1": {"rollout_frequency": 1},
        "every-2": {"rollout_frequency": 2},
        "every-4": {"rollout_frequency": 4},
    },
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
    questions=(Compare("every-2", "every-1"), Compare("every-4", "every-1")),
)

# Thinking needs room: 64 tokens a turn, no `<answer>` prefill. The reasoning-aware reward pays 0.5 for a
# thought of 5-100 words and 0.5 x the share of the turn's moves it names. Without a thought both terms
# are 0, so "no-think with the reward" would be the no-think arm again: it is left out.
THINK = {"think": True, "prefill": False, "response_length": 64}
REASONING = Study(
    name="finding6-reasoning",
    question="Does reasoning last without a reward that asks for it, and does thinking help at all?",
    envs=GRID_ENVS,
    arms={
        "no-think": {"think": False, "prefill": True},
        "think": THINK,
        "think-reasoning-reward": {**THINK, "think_length_coeff": 0.5, "think_names_action_coeff": 0.5},
    },
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
    questions=(Compare("think", "no-think"), Compare("think-reasoning-reward", "think")),
    extra_panels={
        "response tokens a turn": "env_runners/response_length_mean",
        "<think> words a turn": "env_runners/think_words_mean",
    },
)

# SPA (arXiv 2510.15047): a stage that teaches the env's dynamics (the next state after a move, in the
# env's words) before the warm start. Both arms then get the same expert warm start and RL.
WORLD_MODEL = Study(
    name="world-model-warm-start",
    question="Does learning the env's dynamics first (SPA's world-model stage) raise success after RL?",
    envs=GRID_ENVS,
    arms={"warm-start": {}, "world-model-then-warm-start": {}},
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
    arm_warm_starts={"world-model-then-warm-start": {"warm_start_world_model_epochs": 1}},
)

# Issue 54: most of the tuned examples' failures repeat a move that changed nothing, since with a Markov
# prompt the state after it reads as the one before. The note arm's state says so (the env option
# `note_no_effect`, envs/no_effect_note.py) in training and evaluation alike; the rooms and rules are the
# same. Its env_config differs, so it warm-starts on demonstrations played with the note (a warm start of its own).
NOOP_NOTE = Study(
    name="noop-note",
    question="Does a state that says the last move changed nothing cut the repeated no-op failures and raise success?",
    envs=GRID_ENVS,
    arms={"note-off": {}, "note-on": {"env_config": {"note_no_effect": True}}},
    seeds=SEEDS,
    budget_min=BOTH_ENVS_BUDGET,
)

# Issue 54: after RL most of Sokoban's failures push the box where it can never reach a target. Whether a
# push does so depends on the cells around the box, which the words render gives only as wall coordinates.
# The sides arm's state names them (the env option `describe_box_sides`, envs/sokoban_words.py) in training
# and evaluation alike, so it warm-starts on demonstrations played with that line.
BOX_SIDES = Study(
    name="box-sides",
    question="Does a state that names what lies on each side of the box cut the stuck-box failures and raise success?",
    envs=("sokoban",),
    arms={"sides-off": {}, "sides-on": {"env_config": {"describe_box_sides": True}}},
    seeds=SEEDS,
    budget_min=BUDGET_MIN["sokoban"],
)

# Issue 54: from the 384-room warm start (0.54 before RL), 15 minutes of RL at the preset's step size added
# +0.03, within chance. Is the step too small for a start that strong? Four times the step (still 10x below
# finding 3's collapsing 2e-3), in trials as long as the RL an AVX2 host's 27-minute job leaves.
RL_STEP_SIZE = Study(
    name="rl-step-size",
    question="From the expert's warm start, does four times the RL step size add more in the same minutes?",
    envs=("sokoban",),
    arms={"lr-5e-5": {}, "lr-2e-4": {"actor_lr": 2e-4}},
    seeds=SEEDS,
    budget_min=10.0,
)

FINDINGS: dict[str, Study] = {
    study.name: study
    for study in (
        CRITIC,
        FILTER,
        EARLY_WARNING,
        GROUPS,
        MOVES,
        FRESHNESS,
        REASONING,
        WORLD_MODEL,
        NOOP_NOTE,
        BOX_SIDES,
        RL_STEP_SIZE,
    )
}


def find_study(name: str) -> Study:
    """A declared finding's study by name, or a user's `module:ATTRIBUTE` (importable from the
    working directory or PYTHONPATH).

    Raises:
        ValueError: no such study, or the attribute is not a `Study`.
    """
    if ":" not in name:
        if name not in FINDINGS:
            raise ValueError(f"no study {name!r}; the declared ones are {sorted(FINDINGS)}, or give module:ATTRIBUTE")
        return FINDINGS[name]
    module_name, _, attribute = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot load study {name!r}: {error}") from error
    if not isinstance(found, Study):
        raise ValueError(f"{name} is a {type(found).__name__}, not a Study")
    return found
