"""Which TextArena games run through the adapter here? One row a game, as a Markdown table.

For each game id of the installed textarena (the base ids: no `-train`/`-raw`
variants), this builds `textarena:<id>` with `envs.make_env`, resets it with a
seed and plays up to `--moves` moves drawn by `env.random_action` (a bracketed
move the game has shown), each game under a time limit. A game works when it
resets and steps without an error; the row says how many players it has, how
many random moves it accepted and whether the game ended. Otherwise the row
gives the error (an NLTK download refused offline, an API key needed, ...).

    python benchmarks/textarena_games.py                      # every game
    python benchmarks/textarena_games.py --games GuessTheNumber-v0,Sudoku-v0
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from envs import make_env  # noqa: E402  (after the checkout is on the path)


class GameTimeout(Exception):
    pass


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", help="comma-separated TextArena ids (default: every base id)")
    parser.add_argument("--moves", type=int, default=30, help="random moves tried per game")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=int, default=30, help="time limit per game")
    return parser.parse_args(argv)


def base_ids() -> list[str]:
    """TextArena's game ids without the wrapper variants it registers beside each game."""
    import textarena

    ids = textarena.envs.registration.ENV_REGISTRY
    return sorted(i for i in ids if not i.endswith(("-train", "-raw")))


def probe(game: str, *, moves: int, seed: int) -> tuple[str, str]:
    """(players, outcome) of one game: how it played, or the error that stopped it."""
    env = make_env(f"textarena:{game}")
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    valid = ended = 0
    for _ in range(moves):
        _, _, terminated, truncated, info = env.step(env.random_action(rng))
        valid += int(info["action_is_valid"])
        if terminated or truncated:
            ended = 1
            break
    players = str(getattr(env, "num_players", "?"))
    return players, f"works: {valid} valid random moves, " + ("game ended" if ended else "game still on")


def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    games = args.games.split(",") if args.games else base_ids()

    def on_alarm(signum: int, frame: object) -> None:
        raise GameTimeout(f"no answer within {args.timeout_s} s")

    signal.signal(signal.SIGALRM, on_alarm)
    rows = ["| game | players | result |", "|---|---|---|"]
    for game in games:
        signal.alarm(args.timeout_s)
        try:
            players, outcome = probe(game, moves=args.moves, seed=args.seed)
        except Exception as error:  # the table reports every failure
            players, outcome = "?", f"fails: {type(error).__name__}: {str(error)[:160]}"
        finally:
            signal.alarm(0)
        rows.append(f"| {game} | {players} | {outcome.replace('|', '/')} |")
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
