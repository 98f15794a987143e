"""The console of a sweep or study: a failed trial's line (the error's last line and where the whole error is), and
Tune's reporter kept quiet."""

import os
import subprocess
import sys

import pytest

from rllib_ragen.run.console import trial_failed_line


def test_a_failed_trial_shows_its_errors_last_line_and_file(tmp_path):
    error_file = tmp_path / "error.txt"
    error_file.write_text("Traceback (most recent call last):\n  File 'x.py'\nValueError: group_size must be >= 2\n\n")
    assert trial_failed_line("a_seed0_bandit", str(error_file)) == (
        f"a_seed0_bandit failed: ValueError: group_size must be >= 2 (the whole error: {error_file})"
    )
    assert trial_failed_line("t1", None) == "t1 failed (Tune kept no error file)"
    assert trial_failed_line("t1", str(tmp_path / "missing.txt")) == "t1 failed (Tune kept no error file)"


@pytest.mark.parametrize(("verbose", "tune_output"), [(False, "None"), (True, "1")])
def test_a_quiet_console_gives_tune_the_reporter_that_prints_nothing_at_verbosity_0(tmp_path, verbose, tune_output):
    """Tune's newer output prints its folder and a TensorBoard command at every fit even at verbosity 0;
    `get_air_verbosity` returning None is Tune choosing its older reporter, silent at verbosity 0."""
    script = (
        "import sys; from pathlib import Path; from rllib_ragen.run.console import quiet_console; "
        f"quiet_console(Path(sys.argv[1]), verbose={verbose}); "
        "from ray.tune.experimental.output import get_air_verbosity; print(get_air_verbosity(1))"
    )
    env = {key: value for key, value in os.environ.items() if key != "RAY_AIR_NEW_OUTPUT"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run.log")], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == tune_output
