"""The console line of a sweep's or study's failed trial: the error's last line and where the whole error is."""

from rllib_ragen.run.console import trial_failed_line


def test_a_failed_trial_shows_its_errors_last_line_and_file(tmp_path):
    error_file = tmp_path / "error.txt"
    error_file.write_text("Traceback (most recent call last):\n  File 'x.py'\nValueError: group_size must be >= 2\n\n")
    assert trial_failed_line("a_seed0_bandit", str(error_file)) == (
        f"a_seed0_bandit failed: ValueError: group_size must be >= 2 (the whole error: {error_file})"
    )
    assert trial_failed_line("t1", None) == "t1 failed (Tune kept no error file)"
    assert trial_failed_line("t1", str(tmp_path / "missing.txt")) == "t1 failed (Tune kept no error file)"
