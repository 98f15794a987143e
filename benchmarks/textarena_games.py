"""Which TextArena games run through the adapter here? One row a game, as a Markdown table.

For each game of the installed textarena (its `-v0` ids; `--all`: every id
but the `-train`/`-raw` wrapper variants), this builds `textarena:<id>` with `envs.make_env`, resets it with a
seed and plays up to `--moves` moves drawn by `env.random_action` (a bracketed
move the game has shown), each game under a time limit. A game works when it
resets and steps without an error; the row says how many players it has, how
many random moves it accepted and whether the game ended. Otherwise the row
gives the error (an NLTK download refused offline, an API key needed, ...).

    python benchmarks/textarena_games.py                      # every game's -v0 id
    python benchmarks/textarena_games.py --all                # and every variant (-hard, -large, ...)
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
    parser.add_argument("--games", help="comma-separated TextArena ids (default: every -v0 id)")
    parser.add_argument("--all", action="store_true", help="every id but the -train/-raw variants")
    parser.add_argument("--moves", type=int, default=30, help="random moves tried per game")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=int, default=30, help="time limit per game")
    return parser.parse_args(argv)


def game_ids(*, every_variant: bool) -> list[str]:
    """TextArena's `-v0` game ids, or with `every_variant` all ids but the wrapper variants beside each game."""
    import textarena

    ids = textarena.envs.registration.ENV_REGISTRY
    if every_variant:
        return sorted(i for i in ids if not i.endswith(("-train", "-raw")))
    return sorted(i for i in ids if i.endswith("-v0"))


def probe(game: str, *, moves: int, seed: int) -> tuple[str, str]:
    """(players, outcome) of one game: how it played, or the error that stopped it."""
    env = make_env(f"textarena:{game}")
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    valid = ended = 0
    players = str(env.num_players)
    for _ in range(moves):
        try:
            move = env.random_action(rng)
        except ValueError:  # the game lists no moves: it resets, but random play cannot probe it further
            return players, "resets; shows no bracketed move for random play"
        _, _, terminated, truncated, info = env.step(move)
        valid += int(info["action_is_valid"])
        if terminated or truncated:
            ended = 1
            break
    return players, f"works: {valid} valid random moves, " + ("game ended" if ended else "game still on")


def main(argv: list[str] | None = None) -> list[str]:
    args = parse_args(argv)
    games = args.games.split(",") if args.games else game_ids(every_variant=args.all)

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
