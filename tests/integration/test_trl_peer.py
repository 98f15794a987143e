"""`benchmarks/trl_peer.py` without TRL: its flags, its figures on hand-made numbers, the work both sides
get (our config, the prompts rendered by the real env and protocol), the TRL side's reward against the
env's own payoffs, and TRL's venv wiring. Installing TRL and timing both sides is the lead's measured run
(its command is in docs/performance.md), not a test."""

import importlib
import math
import site
import sys
from pathlib import Path

import pytest

from envs.bandit import V1_LOW_PAYOFF
from envs.user_errors import UserError

ROOT = Path(__file__).resolve().parents[2]
# The scripts import their sibling benchmarks by name, as they do when run.
sys.path.insert(0, str(ROOT / "benchmarks"))
trl_peer = importlib.import_module("trl_peer")
trl_peer_side = importlib.import_module("trl_peer_side")
trl_venv = importlib.import_module("trl_venv")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "1"], "--steps must be at least 2"),
        (["--group-size", "3"], "--group-size must be at least 2 and divide 16, got 3"),
        (["--group-size", "1"], "--group-size must be at least 2 and divide 16, got 1"),
        (["--temperature", "0"], "--temperature must be positive, got 0.0"),
        (["--trl-timeout", "-5"], "--trl-timeout must be positive"),
        (["--answer-format", "long"], "invalid choice: 'long'"),
    ],
)
def test_bad_flags_are_named(argv, message):
    with pytest.raises(UserError, match=message):
        trl_peer.parse_args(argv)


def test_the_figures_on_hand_made_steps():
    assert trl_peer.timed_median([30.0, 3.0, 5.0, 4.0]) == 4.0  # step 1 left out; median of 3, 5, 4
    assert trl_peer.timed_median([9.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="at least 2 steps"):
        trl_peer.timed_median([1.0])
    ours = trl_peer.side_figures("ours", [20.0, 2.0, 3.0, 2.5], [60.0, 40.0, 42.0, 44.0])
    assert (ours.median_s, ours.mean_completion_tokens, ours.steps) == (2.5, 42.0, 4)
    theirs = trl_peer.side_figures("TRL generate", [50.0, 10.0, 12.0], [10.0, 44.0, 40.4])
    assert (theirs.median_s, theirs.mean_completion_tokens) == (11.0, pytest.approx(42.2))
    matched = trl_peer.comparison(ours, theirs)
    assert matched["time_ratio"] == pytest.approx(2.5 / 11.0) and matched["lengths_match"]
    assert matched["length_ratio"] == pytest.approx(42.0 / 42.2)
    longer = trl_peer.side_figures("TRL vllm", [5.0, 8.0], [0.0, 50.0])  # 42 / 50 = 0.84: 16% apart
    apart = trl_peer.comparison(ours, longer)
    assert apart["time_ratio"] == pytest.approx(2.5 / 8.0) and not apart["lengths_match"]
    lines = trl_peer.report_lines(ours, [theirs, longer], {"trl_vllm": "ImportError: no vLLM"})
    assert lines[0] == "ours: median 2.50 s/step over steps 2-4, mean completion 42.0 tokens"
    assert "ratio ours / TRL generate: 0.23x its time" in lines[3] and "(matched)" in lines[3]
    assert "0.84 (NOT matched" in lines[4] and lines[5] == "trl_vllm: did not run: ImportError: no vLLM"
    with pytest.raises(ValueError, match="2 step times but 3 step lengths"):
        trl_peer.side_figures("x", [1.0, 2.0], [1.0, 2.0, 3.0])


def test_our_side_is_the_peer_work(tiny_model_path):
    args = trl_peer.parse_args(["--group-size", "8", "--answer-format", "short", "--temperature", "0.7"])
    config = trl_peer.our_config(args, tiny_model_path)
    assert config.env == "bandit_phoenix_dragon"
    assert (config.rollout.n_groups, config.rollout.group_size, config.rollout.response_length) == (2, 8, 64)
    assert config.rollout.temperature == 0.7 and not config.protocol.think and config.protocol.prefill
    assert (config.advantages.advantage_estimator, config.group_filter.rollout_filter_ratio) == ("grpo", 1.0)
    assert (config.optim.actor_lr, config.loss.kl_coeff, config.loss.entropy_coeff) == (1e-5, 0.0, 0.0)
    assert config.update.micro_batch_size == 16 and config.update.micro_batch_tokens is None  # one pass, as TRL's
    assert config.scoring.autocast_dtype == "bfloat16" and config.scoring.autocast_lm_head  # TRL's precision
    assert config.llm_module.critic == "none" and config.llm_module.trained_top_layers is None
    assert not config.llm_module.gradient_checkpointing
    assert config.starpo_eval.eval_interval == 0 and config.collapse_metrics.collapse_metrics_interval == 0


def test_both_sides_get_our_rendered_first_prompts(tiny_model_path, tiny_tokenizer):
    args = trl_peer.parse_args(["--steps", "3", "--trl-temperature", "0.9"])
    config = trl_peer.our_config(args, tiny_model_path)
    spec = trl_peer.trl_spec(args, config, tiny_model_path)
    start = config.rollout.train_seed_start
    # 3 steps x 4 prompts (16 completions in groups of 4), in our seed cursor's order.
    assert [row["seed"] for row in spec["prompts"]] == list(range(start, start + 12))
    assert (spec["completions"], spec["group_size"], spec["max_tokens"], spec["steps"]) == (16, 4, 64, 3)
    assert spec["trl_temperature"] == 0.9 and spec["lr"] == 1e-5 and spec["protocol"]["think"]
    for row in spec["prompts"]:
        assert "Phoenix" in row["text"] and "Dragon" in row["text"] and "<think>" in row["text"]
        assert row["text"] == tiny_tokenizer.decode(row["ids"])
        assert tiny_tokenizer(row["text"])["input_ids"] == row["ids"]  # what TRL tokenises is what we render
    assert spec["prompts"][0]["text"].endswith("<|im_start|>assistant\n")


def test_the_trl_side_reward_is_the_env_reward(tiny_model_path, tiny_tokenizer):
    args = trl_peer.parse_args(["--group-size", "2", "--answer-format", "short"])
    spec = trl_peer.trl_spec(args, trl_peer.our_config(args, tiny_model_path), tiny_model_path)
    lengths, rewards = [], []
    reward = trl_peer_side.env_reward(spec, tiny_tokenizer, lengths, rewards)
    answers = ["Phoenix</answer>", "no answer at all", "Dragon</answer>", "Dragon</answer>"]
    ids = [tiny_tokenizer.encode(text) for text in answers]
    got = reward(completion_ids=ids, seed=[7, 7, 8, 8], prompts=None, completions=answers)
    # The low arm always pays RAGEN v1's 0.15; an answer without a valid action gets the CPU preset's
    # format penalty (-1.0) and no payout; the high arm pays 1.0 or nothing.
    assert got[0] == pytest.approx(V1_LOW_PAYOFF) and got[1] == -1.0 and set(got[2:]) <= {0.0, 1.0}
    assert lengths == [pytest.approx(sum(map(len, ids)) / 4)] and rewards == [pytest.approx(sum(got) / 4)]


def test_the_venv_sees_this_environment_pinned(tmp_path):
    venv = tmp_path / "venv"
    own = venv / "lib" / "python3.11" / "site-packages"
    own.mkdir(parents=True)
    assert trl_venv.installed_trl(venv) is None
    trl_venv.link_project_environment(venv)
    link = (own / trl_venv.PROJECT_LINK).read_text().splitlines()
    assert link == [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
    import torch
    import transformers

    pins = trl_venv.project_constraints().splitlines()
    assert f"torch=={torch.__version__}" in pins and f"transformers=={transformers.__version__}" in pins
    assert not any(line.startswith("-e") or " @ " in line for line in pins)
    assert math.isclose(len(pins), len(set(pins)))
