"""Game evaluation: win, draw and loss rates of one module against a fixed opponent, with 95% Wilson
intervals, from games whose seats alternate (`self_play_settings.alternating_seats`); for Kuhn Poker
also the chips won per hand beside the equilibrium's value for the same seats.

Kuhn Poker's equilibrium (ante 1, bet 1) is worth -1/18 chip a hand to the player who acts first in
that hand and +1/18 to the other; TextArena's KuhnPoker alternates who opens, so the equilibrium's
chips per hand for a seat are the mean of those values over the hands it opened and did not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rllib_ragen.intervals import wilson_interval
from rllib_ragen.rollout.game_rollout import GameResult

KUHN_FIRST_PLAYER_VALUE = -1.0 / 18.0
OUTCOMES = ("win", "draw", "loss")


@dataclasses.dataclass(frozen=True)
class GameScore:
    """An evaluated module's outcomes against one opponent.

    Attributes:
        outcomes: The module's outcome of each game ("win", "draw" or "loss"), in game order: the same
            seeds in two evaluations give paired outcomes.
        seats: The seat the evaluated module played in each game, in game order.
        chips_per_hand: Kuhn Poker: the module's mean net chips per hand; None for other games.
        equilibrium_chips_per_hand: Kuhn Poker: what the equilibrium would win per hand on the same seats.
        forfeits: Whether each game was lost by the module's own invalid move (SPIRAL's rule), in game order.
    """

    outcomes: tuple[str, ...]
    seats: tuple[str, ...]
    chips_per_hand: float | None = None
    equilibrium_chips_per_hand: float | None = None
    forfeits: tuple[bool, ...] = ()

    @property
    def forfeit_count(self) -> int:
        """Games the module lost by its own invalid move."""
        return sum(self.forfeits)

    @property
    def games(self) -> int:
        return len(self.outcomes)

    @property
    def counts(self) -> dict[str, int]:
        """Games won, drawn and lost (keys of `OUTCOMES`)."""
        return {outcome: self.outcomes.count(outcome) for outcome in OUTCOMES}

    def indicators(self, outcome: str) -> list[float]:
        """1.0 for each game that ended in `outcome`, else 0.0, in game order."""
        return [float(o == outcome) for o in self.outcomes]

    def rate(self, outcome: str) -> float:
        return self.counts[outcome] / self.games

    def interval(self, outcome: str) -> tuple[float, float]:
        """The 95% Wilson interval of an outcome's rate."""
        return wilson_interval(self.counts[outcome], self.games)

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat metrics: `<prefix>win_rate`, `..._low`, `..._high` per outcome, `<prefix>forfeit_rate` (the
        games lost by the module's own invalid move), and Kuhn's chips."""
        out: dict[str, float] = {f"{prefix}games": float(self.games)}
        out[f"{prefix}forfeit_rate"] = self.forfeit_count / self.games
        for outcome in OUTCOMES:
            low, high = self.interval(outcome)
            out |= {f"{prefix}{outcome}_rate": self.rate(outcome), f"{prefix}{outcome}_rate_low": low}
            out[f"{prefix}{outcome}_rate_high"] = high
        if self.chips_per_hand is not None and self.equilibrium_chips_per_hand is not None:
            out[f"{prefix}chips_per_hand"] = self.chips_per_hand
            out[f"{prefix}equilibrium_chips_per_hand"] = self.equilibrium_chips_per_hand
        return out


def score_games(results: Sequence[GameResult], evaluated: str) -> GameScore:
    """Scores `evaluated`'s games (each result must seat it on exactly one seat); Kuhn Poker's chips when
    every game kept them.

    Args:
        results: The games, in order.
        evaluated: The evaluated module id.
    """
    if not results:
        raise ValueError("no game to score")
    outcomes, seats, forfeits, chips, equilibrium, hands = [], [], [], 0.0, 0.0, 0
    kuhn = all(result.chips is not None and result.hands_opened is not None for result in results)
    for result in results:
        seat = _seat_of(result, evaluated)
        seats.append(seat)
        reward = result.rewards[seat]
        outcomes.append("win" if reward > 0 else "loss" if reward < 0 else "draw")
        forfeits.append(result.forfeited_by == seat)
        if kuhn and result.chips is not None and result.hands_opened is not None:
            opened, played = result.hands_opened[seat]
            chips += result.chips[seat]
            equilibrium += KUHN_FIRST_PLAYER_VALUE * opened - KUHN_FIRST_PLAYER_VALUE * (played - opened)
            hands += played
    if not kuhn:
        return GameScore(tuple(outcomes), tuple(seats), forfeits=tuple(forfeits))
    return GameScore(tuple(outcomes), tuple(seats), chips / hands, equilibrium / hands, tuple(forfeits))


def _seat_of(result: GameResult, evaluated: str) -> str:
    seats = [seat for seat, module in result.modules.items() if module == evaluated]
    if len(seats) != 1:
        raise ValueError(f"game of seed {result.seed} seats {evaluated!r} on {seats}: an evaluation needs one seat")
    return seats[0]
