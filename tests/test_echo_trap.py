import pytest

from rllib_ragen.echo_trap import EchoTrapMonitor


def test_warns_only_after_a_full_window_below_the_ratio():
    monitor = EchoTrapMonitor(window=3, ratio=0.1)
    # Baseline: mean of the first 3 values = (0.4 + 0.5 + 0.6) / 3 = 0.5 -> threshold 0.05.
    assert [monitor.update(v) for v in (0.4, 0.5, 0.6)] == [None, None, None]
    assert monitor.baseline == pytest.approx(0.5)
    assert monitor.update(0.04) is None  # 1 low iteration
    assert monitor.update(0.01) is None  # 2
    warning = monitor.update(0.0)  # 3 in a row: the trap
    assert warning is not None and "echo trap" in warning


def test_a_recovery_resets_the_streak():
    monitor = EchoTrapMonitor(window=2, ratio=0.5)
    for value in (1.0, 1.0, 0.1, 0.9, 0.1):  # threshold 0.5; the 0.9 breaks the streak
        assert monitor.update(value) is None
    assert monitor.update(0.1) is not None


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"ratio": 1.5}, {"ratio": 0.0}])
def test_bad_settings(kwargs):
    with pytest.raises(ValueError):
        EchoTrapMonitor(**kwargs)
