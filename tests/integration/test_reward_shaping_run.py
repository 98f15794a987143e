"""A StarPO iteration with reasoning-aware shaping and selective token masks logs every term, each
with the value computed by hand from the answers the policy gave.

The policy is the real tiny-random model in the real HF engine, made to give one of two known
answers (a random model almost never writes a well-formed thought), so that each term's value is
known in advance: both answers move Up, only their thoughts differ.
"""

from __future__ import annotations

import numpy as np
import pytest
from ray.rllib.core import DEFAULT_MODULE_ID
from run_helpers import ForcedAnswerEngine

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.inference.engine import Completion
from rllib_ragen.run.tracking import flatten_metrics

COEFF = 0.1  # think_length_coeff and think_names_action_coeff
# Thought of 8 words (inside the default band of 5 to 100) naming the action: both terms 1, bonus 0.2.
NAMING = "<think>I push the box Up to the goal</think><answer>Up</answer>"
# Thought of 1 word, naming nothing: both terms 0, bonus 0.
TERSE = "<think>hmm</think><answer>Up</answer>"
TERMS = {NAMING: {"think_words": 8.0, "think_length": 1.0, "think_names_action": 1.0},
         TERSE: {"think_words": 1.0, "think_length": 0.0, "think_names_action": 0.0}}  # fmt: skip


class AlternatingAnswers(ForcedAnswerEngine):
    """Answers the prompts of each call with `answers[0]`, `answers[1]`, `answers[0]`, ... in turn
    (the members of a group sit side by side, so each group holds both answers)."""

    def __init__(self, engine, answers: list[list[int]]) -> None:
        super().__init__(engine, answers[0])
        self.answers = answers

    def generate(self, prompts, params) -> list[Completion]:
        chosen = [self.answers[i % len(self.answers)] for i in range(len(prompts))]
        logprobs = self.engine.score(prompts, chosen)
        return [Completion(list(ids), list(lp), "stop") for ids, lp in zip(chosen, logprobs)]


def _expected(episodes, answer_of: dict[tuple[int, ...], str]) -> tuple[dict[str, float], dict[str, float]]:
    """The rollout and learner metrics this iteration must log, computed from the answers by hand."""
    turns, returns, task_returns, lengths = [], [], [], []
    for episode in episodes:
        for trajectory in episode.agent_episodes.values():
            answers = [answer_of[tuple(action)] for action in trajectory.get_actions()]
            bonuses = [COEFF * (TERMS[a]["think_length"] + TERMS[a]["think_names_action"]) for a in answers]
            turns.extend({**TERMS[a], "shaping_bonus": b} for a, b in zip(answers, bonuses))
            returns.append(float(sum(trajectory.get_rewards())))
            task_returns.append(returns[-1] - sum(bonuses))  # the env's reward is what the bonus leaves
            lengths.append(sum(len(action) for action in trajectory.get_actions()))
    rollout = {f"{key}_mean": float(np.mean([t[key] for t in turns])) for key in turns[0]}
    rollout.update(episode_return_mean=float(np.mean(returns)), task_return_mean=float(np.mean(task_returns)))
    # alpha = 1: weight (L_i / mean L) ** -1 over the generated tokens L_i of each trajectory.
    weights = np.mean(lengths) / np.asarray(lengths, dtype=float)
    learner = {"advantage_length_weight_min": weights.min(), "advantage_length_weight_max": weights.max()}
    return rollout, learner


def test_iteration_with_shaping_logs_every_term(tiny_model_path, tiny_tokenizer, ray_session):
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(tiny_model_path), critic="head")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=32)
        .inference(engine="hf")
        .training(
            mini_batch_size=4, micro_batch_size=2, rollout_filter_ratio=1.0,
            loss_token_mask="think_and_answer", advantage_token_mask="answer_only",
        )
        .reward_shaping(think_length_coeff=COEFF, think_names_action_coeff=COEFF, advantage_length_weight=1.0)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    runner = algo.env_runner
    stop = runner.protocol.stop_token_ids[0]
    answer_of = {(*tiny_tokenizer.encode(text, add_special_tokens=False), stop): text for text in TERMS}
    runner.engine = AlternatingAnswers(runner.engine, [list(ids) for ids in answer_of])
    sampled = []
    sample = runner.sample
    runner.sample = lambda **kw: sampled.append(sample(**kw)) or sampled[-1]
    try:
        result = algo.train()
    finally:
        algo.stop()
    (episodes,) = sampled
    rollout, learner = _expected(episodes, answer_of)
    assert 0 < rollout["shaping_bonus_mean"] < 2 * COEFF  # both answers were given
    # Every numeric leaf of the result goes to MLflow under its flattened name, with these values.
    logged = flatten_metrics(result)
    for key, value in rollout.items():
        assert logged[f"env_runners/{key}"] == pytest.approx(value), key
    for key, value in learner.items():
        assert logged[f"learners/{DEFAULT_MODULE_ID}/{key}"] == pytest.approx(value), key
    for key in ("policy_loss", "vf_loss"):
        assert np.isfinite(logged[f"learners/{DEFAULT_MODULE_ID}/{key}"]), key
