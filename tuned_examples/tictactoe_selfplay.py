"""Self-play on TicTacToe (issue 49, SPIRAL): `python tuned_examples/tictactoe_selfplay.py --help` lists the flags.

With no flags: SmolLM2-135M plays TextArena's TicTacToe in a league (RLlib's self-play league, SPIRAL's rules
and advantages): two games each in turn against a frozen snapshot of the policy it started from, random play
twice, and the exact minimax expert, seats alternating. It is trained with RAE (a moving-average baseline per
seat and opponent) under SPIRAL's rules (an invalid move ends the game: -1.5 for the offender, +0.5 for the
other seat; 9 moves at most). Each prompt holds the last state only: the board in four short lines, each free
cell shown as its number, and the rules in the seat's system prompt (`game_render="board"`). Before the RL, a
warm start behaviour-clones the exact minimax expert playing both seats of self-play's own games into the top 10
layers. The evaluation before and after the RL plays 128 games against the random
opponent, the minimax expert and the policy the run started from (a second, frozen engine), seats
alternating, each game opening with 0-3 random moves drawn from its seed, with 95% intervals:
`docs/self_play.md`. Needs the TextArena extra:
`bash scripts/install.sh cpu,textarena`.

Training games start from the empty board; the warm start's and the evaluation's games open with 0-3 random moves,
so that they do not all repeat one line of play.

Results: docs/results/self_play_tictactoe.md. On an AVX2-only EPYC in float32 the job with no flags, from an
empty cache, holds 8-9 RL iterations. With training games from random openings (the fourteenth run) those
iterations made its play worse against its start and the expert. From the empty board, on seeds no run played
(this config, the sixteenth run), it won more against its start (+0.102 [+0.016, +0.184]), did no worse against
the expert, and won more against random play by +0.078 [-0.006, +0.160], within chance. A CPU with AMX or
AVX-512 BF16 computes the same job in bf16, several times faster.

The config below is the whole config: every setting that differs from `StarPOConfig()`'s defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllib_ragen.run.experiment import main

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig

GAME = "TicTacToe-v0"


def tictactoe_selfplay_config() -> StarPOConfig:
    """The example's config (built after the flags are checked: these imports load Ray and torch)."""
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.hardware import fast_bf16

    bf16 = fast_bf16()
    return (
        StarPOConfig()
        # The single-seat game against random play: what the warm start and the fixed-seed evaluation play.
        .environment(f"textarena:{GAME}")
        .llm(model="smollm2-135m-instruct", critic="none", trained_top_layers=10)
        .rollouts(
            # 16 games an iteration, each its own group (two trained seats in self-play, one against another).
            n_groups=16,
            max_actions_per_turn=1,
            history_window=1,
            think=False,
            prefill=True,
            response_length=12,
        )
        .inference(max_model_len=2048, max_batch_size=64, engine_dtype="bfloat16" if bf16 else "float32")
        .training(
            advantage_estimator="rae",
            # Every game trains: RAE's baselines are per seat, not per group, so no group is left out.
            rollout_filter_ratio=1.0,
            # 5e-5 changed no sampled answer in 7 updates (the eighth run); 1e-4 won more against random play in 9
            # (the ninth); 2e-4 made an exploiter of its start that lost half its games to the expert (the tenth);
            # 1.5e-4 beat its start with the expert in the league and lost no game to it (the twelfth).
            actor_lr=1.5e-4,
            # Rows share their seat's system prompt: a micro-batch of 1024 distinct positions runs it once
            # (the token tree), where 8 rows of 150 tokens would run it 8 times.
            micro_batch_tokens=1024,
            autocast_dtype="bfloat16" if bf16 else None,
        )
        .self_play(
            self_play_game=GAME,
            # A league, two games each in turn: the policy the run started from (a frozen snapshot of itself),
            # random play twice, and the expert. Self-play between two copies of the warm start is 90% draws (the
            # seventh run); random play finds the positions it loses (half the games: with a quarter, the twelfth
            # run won no more against it); against its start alone it learns lines that the expert punishes (the
            # ninth and tenth runs lost 18 and 43 points more to it), so the expert keeps a quarter.
            self_play_opponent=("frozen", "random", "random", "minimax"),
            max_game_turns=9,
            # With 0-3 random openings their luck decided much of each outcome, which RAE's baseline per seat and
            # opponent leaves in every advantage: RL made play worse (the fourteenth run; the sixteenth: none).
            training_opening_moves=0,
            # The board in four short lines, the rules in the system prompt: about a third of TextArena's tokens
            # a turn (the fifth run's warm start, on TextArena's messages, did not fit the job in float32).
            game_render="board",
            game_eval_opponents=("random", "minimax", "frozen"),
            game_eval_games=128,
            # From the empty board the near-deterministic policy, its start and the expert played one game per
            # seat over and over (the thirteenth run); with openings the 128 games are as many positions.
            game_eval_opening_moves=3,
        )
        # Before and after the RL only (the job budget's end evaluates): 384 games take minutes on 2 cores. The 8
        # self-play games on fixed seeds are the trajectory page's; the games against each opponent start at
        # seed 5000, which no run before the sixteenth played, apart from the training seeds (from 10000).
        .starpo_evaluation(eval_interval=100, eval_size=8, eval_seed=5000)
        .debugging(seed=0)
    )


# The minimax expert on both seats of 64 self-play games, each opening with 0-3 random moves of its own (minimax
# is deterministic: from the empty board its games would be one per seat), on self-play's own prompts,
# behaviour-cloned into SmolLM2's last 10 layers
# (`rllib_ragen.data.game_demonstrations`). Random legal play taught the format but not to read the board (the
# first run); the expert as player 0 of the single-seat env (the second and third runs) never saw player 1's
# positions nor self-play's prompts. 96 games gave 192 trajectories, the single-seat warm start's 24 steps: 192
# games (48 steps) took 25-43 s a step, over 20 minutes of the job (docs/results/self_play_tictactoe.md, fourth run).
# With the board render, 96 games took 24.6 s a step in float32 on an AVX2-only EPYC and the answer NLL levelled off
# at about 0.15 from the fifth of 24 steps on (the sixth run): 64 games, 16 steps.
WARM_START = dict(
    player="expert",
    num_examples=64,
    epochs=1,
    batch_size=8,
    lr=3e-4,
    trained_top_layers=10,
    game_opening_moves=3,
)


if __name__ == "__main__":
    main(
        env=f"textarena:{GAME}",
        config=tictactoe_selfplay_config,
        warm_start_choices=WARM_START,
        description="Train an LLM to play TicTacToe by self-play (SPIRAL's RAE) with StarPO.",
        stop_iters=200,
        job_budget_min=27.0,
    )
