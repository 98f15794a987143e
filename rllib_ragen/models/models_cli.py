"""`rllib-ragen models` (also `python -m rllib_ragen.models`): list the built-in models, or pull one."""

from __future__ import annotations

import argparse
from pathlib import Path

from envs.user_errors import CLIParser, front_door, input_checks
from rllib_ragen.models.cache import CACHE_ENV_VAR, MARKER_FILE, default_cache_dir
from rllib_ragen.models.model_resolution import BUILTIN_MODELS, resolve_model

PROG = "python -m rllib_ragen.models"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of `list` and `pull`."""
    common = CLIParser(add_help=False)
    common.add_argument(
        "--cache-dir", type=Path, default=None, help=f"cache root (default: ${CACHE_ENV_VAR} or ~/.cache/rllib_ragen)"
    )
    parser = CLIParser(
        prog=prog, description="The built-in models (built once into the cache), or any model, as a local directory."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", parents=[common], help="list the built-in models and whether they are cached")
    pull = commands.add_parser("pull", parents=[common], help="download or build a model; print its local directory")
    pull.add_argument("name", help="a built-in model name, a hub id ORG/NAME, or a local directory")
    return parser


def _list_builtins(cache_root: Path) -> None:
    for model in BUILTIN_MODELS.values():
        target = cache_root / "models" / model.name
        state = f"cached at {target}" if (target / MARKER_FILE).is_file() else "not built yet"
        print(f"{model.name}\t{state}\n    {model.description}")


@front_door
def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    """Entry point of `python -m rllib_ragen.models` and `rllib-ragen models`; returns the exit status
    (an unknown or broken model: one `error:` line and exit code 2)."""
    args = build_parser(prog).parse_args(argv)
    cache_root = args.cache_dir.expanduser() if args.cache_dir is not None else default_cache_dir()
    if args.command == "list":
        _list_builtins(cache_root)
        return 0
    with input_checks():  # a tokenizer without a chat template is a ValueError
        path = resolve_model(args.name, cache_dir=cache_root, progress=True)
    print(path)
    return 0
