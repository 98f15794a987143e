"""The study figure's pooled success: each seed's k-th evaluation beside the others', and the finals together,
though time budgets make the seeds evaluate at different iterations."""

import math

import pandas as pd

from rllib_ragen.run.analysis import EVALUATION_SUCCESS, TRAINING_SECONDS
from rllib_ragen.run.study_report import TrialRun, aligned_evaluations


def _trial(seed: int, evaluations: dict[int, float], iterations: int) -> TrialRun:
    """A trial of `iterations` iterations, 30 s each, evaluated at the given iterations."""
    index = pd.Index(range(iterations + 1), name="step")
    history = pd.DataFrame(
        {
            EVALUATION_SUCCESS[0]: [evaluations.get(i, math.nan) for i in index],
            TRAINING_SECONDS: [30.0 * i for i in index],
        },
        index=index,
    )
    return TrialRun("arm", seed, "frozenlake", f"run{seed}", "FINISHED", 128, history)


def test_the_kth_evaluations_pool_and_the_finals_pool_though_their_iterations_differ():
    # Seed 0: before RL, iteration 10 and its final at 23; seed 1: before RL, 10, 20 and its final at 24.
    trials = [_trial(0, {0: 0.5, 10: 0.75, 23: 0.8125}, 23), _trial(1, {0: 0.25, 10: 0.5, 20: 0.75, 24: 0.875}, 24)]
    minutes, successes = aligned_evaluations(trials)
    assert successes.values.tolist() == [[0.5, 0.25], [0.75, 0.5], [0.8125, 0.875]]
    assert minutes.values.tolist() == [[0.0, 0.0], [5.0, 5.0], [11.5, 12.0]]


def test_a_trial_without_evaluations_gives_no_points():
    minutes, successes = aligned_evaluations([_trial(0, {}, 3), _trial(1, {3: 0.5}, 3)])
    assert minutes.empty and successes.empty
