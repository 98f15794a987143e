"""`rllib-ragen`: the command line, one subcommand per job; `rllib-ragen COMMAND --help` lists its flags.

    rllib-ragen train --env sokoban            # what tuned_examples/sokoban_starpo.py runs
    rllib-ragen evaluate checkpoints/sokoban-starpo --generalisation
    rllib-ragen models pull smollm2-135m-instruct
    rllib-ragen sweep --env bandit --grid group_size=4,8
    rllib-ragen study finding2-4-filter        # rllib-ragen study --list

Each subcommand's module is imported only when it runs (`train --help` and
`evaluate --help` answer before Ray loads). Without the console script:
`python -m rllib_ragen COMMAND ...`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from envs.user_errors import CLIParser, UserError, front_door

PROG = "rllib-ragen"


def train(argv: Sequence[str], prog: str) -> int:
    """StarPO on `--env NAME` with the tuned examples' flags and that env's defaults (`TUNED_RUNS`)."""
    from rllib_ragen.run.experiment import main

    env_flag = argparse.ArgumentParser(add_help=False)
    env_flag.add_argument("--env")
    env = env_flag.parse_known_args(argv)[0].env
    if env is None and not {"-h", "--help"} & set(argv):
        raise UserError(f"{prog} needs --env NAME (see {prog} --help)")
    main(env=env or "sokoban", argv=list(argv), prog=prog)
    return 0


def evaluate(argv: Sequence[str], prog: str) -> int:
    from rllib_ragen.run.evaluate import main

    return main(list(argv), prog=prog)


def models(argv: Sequence[str], prog: str) -> int:
    from rllib_ragen.models.models_cli import main

    return main(list(argv), prog=prog)


def sweep(argv: Sequence[str], prog: str) -> int:
    from rllib_ragen.run.sweep import main

    main(list(argv), prog=prog)
    return 0


def study(argv: Sequence[str], prog: str) -> int:
    from rllib_ragen.run.study_cli import main

    return main(list(argv), prog=prog)


# name -> (what it does, its entry point taking the flags and the program name).
COMMANDS: dict[str, tuple[str, Callable[[Sequence[str], str], int]]] = {
    "train": ("train StarPO on an env (--env NAME; the tuned examples' flags)", train),
    "evaluate": ("evaluate a checkpoint or model on fixed seeds per env, with 95% intervals", evaluate),
    "models": ("list the built-in models, or pull one into the cache", models),
    "sweep": ("a Ray Tune sweep of StarPO over a grid of settings", sweep),
    "study": ("a study: a Tune experiment answering one question, with its figure and verdicts", study),
}


def build_parser() -> argparse.ArgumentParser:
    parser = CLIParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<10} {what}" for name, (what, _) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=f"one of {', '.join(COMMANDS)}")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its flags (rllib-ragen COMMAND --help)")
    return parser


@front_door
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rllib-ragen` console script; returns the exit status (bad input: one
    `error:` line and exit code 2, from whichever subcommand finds it)."""
    args = build_parser().parse_args(argv)
    _, run = COMMANDS[args.command]
    return run(args.args, f"{PROG} {args.command}")
