"""A study's verdict on "does arm B end above arm A?", from both kinds of noise: the evaluation's
(a pooled Wilson interval per arm, a Newcombe interval of the difference) and the training seeds'
(does every seed's difference have the same sign?). The rule is written down in docs/studies.md.

- YES: the difference's 95% interval lies above 0 and B ends above A with every training seed.
- NO, BELOW: the interval lies below 0 and B ends below A with every training seed.
- SEED-DEPENDENT: the interval excludes 0, but the training seeds disagree on the sign (or one ties).
- NO DIFFERENCE SHOWN: the interval includes 0.
- NOT ANSWERED: an arm has fewer than 2 training seeds whose trial finished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rllib_ragen.intervals import newcombe_difference_interval, wilson_interval
from rllib_ragen.run.study import MIN_TRAINING_SEEDS, Compare

YES, BELOW, SEED_DEPENDENT, NO_DIFFERENCE, NOT_ANSWERED = (
    "YES",
    "NO, BELOW",
    "SEED-DEPENDENT",
    "NO DIFFERENCE SHOWN",
    "NOT ANSWERED",
)


@dataclasses.dataclass(frozen=True)
class ArmOutcome:
    """An arm's final evaluation on one env: successes per training seed, each out of `eval_size` seeds.

    Args:
        arm: The arm's name.
        successes: Training seed -> successes on the fixed evaluation seeds at the trial's end
            (finished trials only).
        eval_size: Evaluation seeds each trial played.
    """

    arm: str
    successes: Mapping[int, int]
    eval_size: int

    def __post_init__(self) -> None:
        if self.eval_size < 1:
            raise ValueError(f"eval_size must be >= 1, got {self.eval_size}")
        for seed, count in self.successes.items():
            if not 0 <= count <= self.eval_size:
                raise ValueError(f"arm {self.arm} seed {seed}: {count} successes of {self.eval_size} seeds")

    @property
    def pooled(self) -> tuple[int, int]:
        """(successes, episodes) over every training seed."""
        return sum(self.successes.values()), self.eval_size * len(self.successes)

    def rate(self, seed: int) -> float:
        return self.successes[seed] / self.eval_size

    def summary(self) -> str:
        """`arm 0.625 [0.539, 0.704]` pooled over its seeds."""
        count, n = self.pooled
        low, high = wilson_interval(count, n)
        return f"{self.arm} {count / n:.3f} [{low:.3f}, {high:.3f}]"


def verdict(question: Compare, arm: ArmOutcome, baseline: ArmOutcome) -> str:
    """The verdict word and its evidence, e.g. `YES: b 0.70 [...] vs a 0.50 [...]; difference +0.20
    [+0.11, +0.28]; by training seed +0.19, +0.22`."""
    short = [o for o in (arm, baseline) if len(o.successes) < MIN_TRAINING_SEEDS]
    if short:
        finished = ", ".join(f"{o.arm} has {len(o.successes)}" for o in short)
        return f"{NOT_ANSWERED}: {finished} finished training seed(s); {MIN_TRAINING_SEEDS} are needed"
    difference, low, high = newcombe_difference_interval(*arm.pooled, *baseline.pooled)
    seeds = sorted(set(arm.successes) & set(baseline.successes))
    by_seed = [arm.rate(seed) - baseline.rate(seed) for seed in seeds]
    if low > 0 and by_seed and all(d > 0 for d in by_seed):
        word = YES
    elif high < 0 and by_seed and all(d < 0 for d in by_seed):
        word = BELOW
    elif low > 0 or high < 0:
        word = SEED_DEPENDENT
    else:
        word = NO_DIFFERENCE
    seed_text = ", ".join(f"{d:+.3f}" for d in by_seed) or "no seed in common"
    return (
        f"{word}: {arm.summary()} vs {baseline.summary()}; difference {difference:+.3f} "
        f"[{low:+.3f}, {high:+.3f}]; by training seed ({', '.join(map(str, seeds))}) {seed_text}"
    )
