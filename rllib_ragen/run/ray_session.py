"""Starting Ray once per driver, so that its workers can import this project."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import ray

from rllib_ragen.rllib_private import (
    canonicalize_bootstrap_address,
    get_ray_address_file,
    parse_address,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# How long a cluster Ray would attach to may take to accept a connection.
CLUSTER_CONNECT_TIMEOUT_S = 10.0


class ClusterUnreachableError(ConnectionError):
    """The Ray cluster `ray.init` would attach to does not answer."""


def init_ray(*, log_to_driver: bool = False) -> None:
    """`ray.init` unless Ray is running, with this checkout on the workers' PYTHONPATH.

    Ray Data tasks, Tune trials and env-runner actors import `rllib_ragen` and
    `envs`; with a plain checkout (no `pip install -e .`) only the driver's
    `sys.path` has them, so a local Ray started here inherits the path.

    Attached to an existing cluster (`RAY_ADDRESS`, a Ray job, or the address
    file the last `ray start` left), the job's workers run this driver's Python
    (`py_executable`), whichever Python's `ray` started the cluster.

    Raises:
        ClusterUnreachableError: that cluster does not accept a connection within
            `CLUSTER_CONNECT_TIMEOUT_S` (instead of Ray's endless GCS retries).
    """
    if ray.is_initialized():
        return
    paths = [
        str(PROJECT_ROOT),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # The address ray.init would attach to (None: it starts a local Ray), found the way ray.init finds it.
    address = canonicalize_bootstrap_address(None)
    runtime_env = None
    if address is not None:
        check_cluster_answers(address, timeout_s=CLUSTER_CONNECT_TIMEOUT_S)
        runtime_env = {"py_executable": sys.executable}
    ray.init(
        include_dashboard=False,
        log_to_driver=log_to_driver,
        configure_logging=False,
        runtime_env=runtime_env,
    )


def check_cluster_answers(address: str, *, timeout_s: float) -> None:
    """Raises `ClusterUnreachableError`, saying what to do, unless `address` (host:port) accepts a connection."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except OSError as error:
        if os.environ.get("RAY_ADDRESS"):
            source, forget = "RAY_ADDRESS", "unset RAY_ADDRESS"
        else:
            stale = get_ray_address_file(None)
            source, forget = (
                f"written to {stale} by the last `ray start`",
                f"delete {stale}",
            )
        raise ClusterUnreachableError(
            f"Ray would attach to the cluster at {address} ({source}), but it does not answer within "
            f"{timeout_s:.0f} s ({error}): the cluster is gone, e.g. its head was killed instead of stopped "
            f"with `ray stop`. Start the cluster again, or {forget}, or set RAY_ADDRESS=local to run on a "
            "new local Ray."
        ) from error
