"""Self-play on Kuhn Poker (issue 49's second game): `python tuned_examples/kuhn_poker_selfplay.py --help`.

With no flags: SmolLM2-135M plays TextArena's KuhnPoker-v0 (three hands a game; whoever holds more chips after
them wins) through the TicTacToe example's path and settings (`tuned_examples/tictactoe_selfplay.py`: RAE keyed
by seat and opponent, SPIRAL's invalid-move rule, the last state in each prompt, the board render: here the hand
in three short lines, about 35 tokens a turn where TextArena's messages take about 150), with what differs for
poker:
- answers of up to 16 tokens;
- a league of its frozen start and random play twice (of 16 games an iteration, 6 against its start and 10
  against random play): the equilibrium it starts near wins 1/6 chip a hand from random play, the best answer
  to random play 0.46, so there is poker to learn against it, and its start is the opponent it must beat;
- no random openings: the deal and the players' mixed moves make each game its own;
- the warm start: Kuhn Poker's Nash equilibrium (`envs.kuhn_equilibrium`) on both seats of 32 self-play games,
  on self-play's own prompts, into the top 10 layers (the TicTacToe example's warm start with another expert);
- the evaluation: 128 games against random play, against its start (a second, frozen engine) and against the
  equilibrium, from seed 8000 (apart from the training seeds), seats alternating, with chips per hand beside
  the equilibrium's value for the same seats.

TextArena 0.7.4's KuhnPoker puts no chip in the pot for a bet or a call; `envs.textarena_two_player` pays it,
so the game played is Kuhn Poker (docs/self_play.md).

Results: docs/results/self_play_kuhn.md. On an AVX2-only EPYC in float32, with no flags from an empty cache,
the job holds 11-12 RL iterations. In the seventh run, on seeds no run played, the policy won 0.594 of 128 games
against random play (0.516 before; paired change +0.078 [+0.009, +0.145]) and 0.703 against its start (0.523;
+0.180 [+0.073, +0.281]), and lost 0.414 against the equilibrium (0.438; -0.023 [-0.066, +0.019], within
chance; the fourth and fifth runs: -0.094 and -0.109, beyond it). Games of one hand (`game_options=
{"max_rounds": 1}`, the sixth run) changed almost no outcome: a start near the equilibrium leaves a one-hand win
rate at most 0.083 to gain (`benchmarks/kuhn_win_ceiling.py`).

The config below is the TicTacToe example's with the lines that differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllib_ragen.run.experiment import main

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig

GAME = "KuhnPoker-v0"


def kuhn_poker_selfplay_config() -> StarPOConfig:
    """The example's config (built after the flags are checked: these imports load Ray and torch)."""
    from tictactoe_selfplay import tictactoe_selfplay_config

    return (
        tictactoe_selfplay_config()
        .environment(f"textarena:{GAME}")
        .rollouts(response_length=16)
        .self_play(
            self_play_game=GAME,
            # Its start in place of self-play between two trained seats (the third run): with it, the fourth and
            # fifth runs lost 27-30 points fewer games to their start and still gained against random play.
            self_play_opponent=("frozen", "random", "random"),
            training_opening_moves=0,
            game_eval_opponents=("random", "frozen", "equilibrium"),
            game_eval_opening_moves=0,
        )
        # Games from seed 8000, which no run played: the third to sixth runs' games (from seeds 10000, 3000 and
        # 7000) chose the league, the evaluated opponents and the three-hand game.
        .starpo_evaluation(eval_seed=8000)
    )


if __name__ == "__main__":
    from tictactoe_selfplay import WARM_START

    main(
        env=f"textarena:{GAME}",
        config=kuhn_poker_selfplay_config,
        # The deals and the equilibrium's mixed moves vary the games: no random openings.
        warm_start_choices=dict(WARM_START, num_examples=32, game_opening_moves=None),
        description="Train an LLM to play Kuhn Poker by self-play (SPIRAL's RAE) with StarPO.",
        stop_iters=200,
        job_budget_min=27.0,
    )
