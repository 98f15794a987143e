"""The private-API adapter: written for the pinned Ray, and every private name it uses still exists."""

import inspect

import pytest
import ray

from rllib_ragen import rllib_private
from rllib_ragen.rllib_private import (
    PRIVATE_NAMES,
    WRITTEN_FOR_RAY,
    check_ray_version,
    config_dict_value,
)


def test_the_installed_ray_is_the_one_the_adapter_was_written_for():
    check_ray_version()  # on another Ray: RuntimeError naming both versions and what to check


def test_another_ray_version_is_refused_with_both_versions_named():
    with pytest.raises(RuntimeError, match=rf"written for ray {WRITTEN_FOR_RAY}, but ray 2\.99\.0 is installed"):
        check_ray_version("2.99.0")


@pytest.mark.parametrize("owner, name", PRIVATE_NAMES, ids=[f"{o.__name__}.{n}" for o, n in PRIVATE_NAMES])
def test_every_private_name_still_exists(owner, name):
    # Methods are class attributes; the learner's maps are set in its __init__/build.
    sources = "".join(inspect.getsource(cls) for cls in owner.__mro__ if cls.__module__.startswith("ray."))
    assert hasattr(owner, name) or f"self.{name} =" in sources or f"self.{name}:" in sources, (
        f"{owner.__name__}.{name} is gone in ray {ray.__version__}: update rllib_ragen.rllib_private"
    )


def test_no_other_module_uses_a_private_ray_name():
    # The adapter is the only module importing ray._private / ray._common or reaching RLlib's internals.
    from pathlib import Path

    package = Path(rllib_private.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "rllib_private.py":
            continue
        text = path.read_text()
        for marker in ("ray._private", "ray._common", "._learner_connector", "._optimizer_parameters",
                       "._uncompiled_update", "learner_group._learner", "._worker_manager", "._translate_special_keys"):
            if marker in text:
                offenders.append(f"{path.relative_to(package)}: {marker}")
    assert not offenders, offenders


def test_config_dict_value_undoes_rllibs_key_renaming():
    from rllib_ragen.algorithm.starpo import StarPOConfig

    config = StarPOConfig().training(lambda_=0.9, gamma=0.8).to_dict()
    assert "lambda" in config and "lambda_" not in config
    assert config_dict_value(config, "lambda_") == 0.9
    assert config_dict_value(config, "gamma") == 0.8
    assert config_dict_value(config, "no_such_setting") is None
