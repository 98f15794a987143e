"""`TrainSeedCursor`: the next training seed, the one place the run keeps it."""

from __future__ import annotations

# The cursor's entry in the algorithm's state (and so in every checkpoint's `state.pkl`).
TRAIN_SEED_CURSOR = "next_train_seed"


class TrainSeedCursor:
    """Hands out training seeds in order, `n_groups` per iteration, so no initial state repeats.

    Args:
        start: The first training seed (`train_seed_start`).
        n_groups: Seeds per iteration, one per group.
    """

    def __init__(self, *, start: int, n_groups: int) -> None:
        self.next_seed = start
        self.n_groups = n_groups

    def take(self) -> list[int]:
        """The next iteration's seeds; the cursor moves past them."""
        seeds = list(range(self.next_seed, self.next_seed + self.n_groups))
        self.next_seed += self.n_groups
        return seeds
