"""Starting Ray once per driver, so that its workers can import this project."""

from __future__ import annotations

import os
from pathlib import Path

import ray

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def init_ray(*, log_to_driver: bool = False) -> None:
    """`ray.init` unless Ray is running, with this checkout on the workers' PYTHONPATH.

    Ray Data tasks, Tune trials and env-runner actors import `rllib_ragen` and
    `envs`; with a plain checkout (no `pip install -e .`) only the driver's
    `sys.path` has them, so a local Ray started here inherits the path.
    """
    if ray.is_initialized():
        return
    paths = [str(PROJECT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray.init(include_dashboard=False, log_to_driver=log_to_driver, configure_logging=False)
