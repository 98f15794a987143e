"""A vLLM engine actor SIGKILLed (by pid, found in Ray's actor table) in the middle of a training
rollout, after an update: the run finishes, each iteration is logged once, and the replacement
serves the learner's current weights (`benchmarks/engine_kills.py` does the same 10 times with
SmolLM2)."""

from __future__ import annotations

import pytest
import ray
from run_helpers import ROOT, load_script

# The tiny model's engine against its learner after a sync: about 2e-3; a stale one, after this lr, far more.
TOLERANCE = 0.01


@pytest.mark.vllm
def test_an_engine_sigkilled_mid_rollout_is_replaced_with_the_current_weights(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bench = load_script(ROOT / "benchmarks" / "engine_kills.py")
    args = bench.parse_args([
        "--kills", "1", "--from-iteration", "2", "--max-delay-s", "0.3", "--stop-iters", "4",
        "--model", str(tiny_model_path), "--tolerance", str(TOLERANCE),
        "--extra", "--engine vllm --no-warm-start --n-groups 2 --group-size 2 --set kv_cache_gb=0.05 "
        "--set max_model_len=512 --set eval_interval=0 --set actor_lr=1e-2 --set entropy_coeff=1.0",
    ])  # fmt: skip
    assert not ray.is_initialized()
    try:
        bench.train_with_kills(args, tmp_path)
    finally:
        ray.shutdown()
    (kill,) = bench.read_kills(tmp_path)
    assert kill["iteration"] >= 2 and kill["replaced_after_s"] is not None  # after an update; replaced
    checks = bench.check_run(args, tmp_path, [kill])
    print(checks)  # the gap and drift found (pytest -rA)
    assert all(ok for ok, _ in checks.values()), checks
