"""95% intervals for success rates measured on fixed evaluation seeds.

- `wilson_interval`: one success rate (Wilson score interval, scipy's
  `binomtest(...).proportion_ci(method="wilson")`).
- `paired_difference_interval`: the change in success between two evaluations
  on the same seeds (before and after RL), with Agresti and Min's adjustment
  of the paired Wald interval (half a count added to each of the four
  outcome cells), which keeps its coverage near 95% for small samples; no
  library has it (statsmodels' paired tests give no interval of the difference).
- `newcombe_difference_interval`: the difference of two independent success
  rates (e.g. two arms of a study, each pooled over its training seeds),
  Newcombe's hybrid score interval (his method 10) built from the two Wilson intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy.stats import binomtest

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(successes: float, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """(low, high) of the success probability after `successes` (a whole number, e.g. 3.0) of `n` trials."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= successes <= n or successes != int(successes):
        raise ValueError(f"successes must be a whole number within [0, {n}], got {successes}")
    interval = binomtest(int(successes), n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


def paired_difference_interval(
    before: Sequence[float], after: Sequence[float], *, z: float = Z95
) -> tuple[float, float, float]:
    """(difference, low, high) of mean(after) - mean(before) for 0/1 outcomes on the same seeds."""
    if len(before) != len(after) or not before:
        raise ValueError(f"need two equally long, non-empty outcome lists, got {len(before)} and {len(after)}")
    pairs = list(zip((bool(b) for b in before), (bool(a) for a in after)))
    gained = sum(1 for b, a in pairs if a and not b)
    lost = sum(1 for b, a in pairs if b and not a)
    n = len(pairs)
    difference = (gained - lost) / n
    # Agresti-Min: half a count in each of the four cells (n grows by 2).
    g, k, m = gained + 0.5, lost + 0.5, n + 2
    centre = (g - k) / m
    half = z * math.sqrt(max((g + k) - (g - k) ** 2 / m, 0.0)) / m
    return difference, max(-1.0, centre - half), min(1.0, centre + half)


def newcombe_difference_interval(
    successes_a: float, n_a: int, successes_b: float, n_b: int
) -> tuple[float, float, float]:
    """(difference, low, high) of rate a - rate b for `successes_a` of `n_a` and `successes_b` of `n_b`."""
    low_a, high_a = wilson_interval(successes_a, n_a)
    low_b, high_b = wilson_interval(successes_b, n_b)
    p_a, p_b = successes_a / n_a, successes_b / n_b
    difference = p_a - p_b
    low = difference - math.sqrt((p_a - low_a) ** 2 + (high_b - p_b) ** 2)
    high = difference + math.sqrt((high_a - p_a) ** 2 + (p_b - low_b) ** 2)
    return difference, low, high


def format_rate(successes: Sequence[float]) -> str:
    """`0.312 [0.236, 0.399]` for a list of 0/1 outcomes."""
    low, high = wilson_interval(sum(bool(s) for s in successes), len(successes))
    return f"{sum(bool(s) for s in successes) / len(successes):.3f} [{low:.3f}, {high:.3f}]"
