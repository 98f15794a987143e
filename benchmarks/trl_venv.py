"""TRL in its own virtual environment, for `benchmarks/trl_peer.py`: TRL is no dependency of this project.

The venv is made from this interpreter's base Python and sees this project's environment through a
`.pth` file (`site.addsitedir`), so TRL's side imports the very torch, transformers, accelerate and
vLLM this project runs on, not a second copy. pip installs only what TRL adds (`datasets` and its
dependencies, TRL itself) into the venv, constrained to the versions this environment already has:
nothing TRL brings can shadow them with another version.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
from pathlib import Path

from envs.user_errors import UserError

TRL_VERSION = "1.16.0"  # GRPOTrainer with beta=0 (no reference model), generate and vLLM colocate modes
TRL_REQUIREMENT = f"trl=={TRL_VERSION}"
DEFAULT_VENV = Path("~/.cache/rllib_ragen/trl-venv").expanduser()
PROJECT_LINK = "rllib_ragen_project.pth"
CHECK_TIMEOUT_S = 120.0  # importing trl once, to see whether the venv is ready


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_trl(venv: Path) -> str | None:
    """The TRL version `venv` imports, or None (no venv, no TRL, or a broken one)."""
    python = venv_python(venv)
    if not python.exists():
        return None
    try:
        done = subprocess.run(
            [str(python), "-c", "import trl; print(trl.__version__)"],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_trl_venv(venv: Path, *, timeout_s: float) -> Path:
    """`venv`'s Python with `TRL_REQUIREMENT` importable, making the venv and installing TRL on first use.

    Raises:
        UserError: the venv cannot be made or pip fails or hangs (the message names which and why).
    """
    if installed_trl(venv) == TRL_VERSION:
        return venv_python(venv)
    print(f"installing {TRL_REQUIREMENT} into {venv} (once; pip from the package registry)", flush=True)
    began = time.perf_counter()
    if not venv_python(venv).exists():
        base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        _run([str(base), "-m", "venv", str(venv)], f"making the venv {venv}", timeout_s)
    link_project_environment(venv)
    constraints = venv / "project-constraints.txt"
    constraints.write_text(project_constraints())
    _run(
        [str(venv_python(venv)), "-m", "pip", "install", "--quiet", "-c", str(constraints), TRL_REQUIREMENT],
        f"pip install {TRL_REQUIREMENT} into {venv}",
        timeout_s,
    )
    found = installed_trl(venv)
    if found != TRL_VERSION:
        raise UserError(f"after installing {TRL_REQUIREMENT} into {venv}, it imports trl {found}; remove {venv}")
    print(f"installed {TRL_REQUIREMENT} in {time.perf_counter() - began:.0f} s", flush=True)
    return venv_python(venv)


def link_project_environment(venv: Path) -> None:
    """Puts this environment's site-packages after the venv's own on the venv's path (its .pth files too)."""
    own = next(venv.glob("lib/python*/site-packages"))
    lines = [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
    (own / PROJECT_LINK).write_text("\n".join(lines) + "\n")


def project_constraints() -> str:
    """`name==version` of every distribution of this environment (editable and URL installs left out)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=True,
    )
    pins = [line for line in done.stdout.splitlines() if "==" in line and " @ " not in line]
    return "\n".join(pins) + "\n"


def _run(command: list[str], what: str, timeout_s: float) -> None:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what} did not finish within --install-timeout {timeout_s:g} s") from None
    if done.returncode != 0:
        tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-4:]
        raise UserError(f"{what} failed (exit code {done.returncode}): " + " | ".join(tail))
