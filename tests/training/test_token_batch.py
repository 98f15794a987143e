"""Token rows <-> trajectory layout, by hand-built trajectories."""


from __future__ import annotations

import pytest
import torch
from ray.rllib.core.columns import Columns

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings, response_token_spans
from rllib_ragen.rollout.prompt.token_history import TokenHistory
from rllib_ragen.rollout.trajectory_record import Trajectory
from rllib_ragen.training.advantages import (
    AdvantageInputs,
    compute_advantages,
    restrict_to_advantage_mask,
)
from rllib_ragen.training.learner import micro_batch_weights
from rllib_ragen.training.losses import policy_loss
from rllib_ragen.training.token_batch import (
    TOKEN_MASKS,
    ResponseSpanLabeller,
    TokenSpans,
    build_token_batch,
    build_token_mask,
    register_token_mask,
    unregister_token_mask,
)


def _trajectory(turns, rewards, group_id, window=None):
    history = TokenHistory([1, 2], history_window=window)
    for user, response in turns:
        history.add_user(user)
        history.add_response(response, [-float(t) for t in response], [9])
    return Trajectory(history, rewards, group_id)


TRAJ_A = ([([10], [20, 21]), ([11, 12], [22])], [0.5, -1.0])
TRAJ_B = ([([13], [23, 24, 25])], [2.0])


def test_full_history_gives_one_row_per_trajectory():
    batch = build_token_batch(
        [_trajectory(*TRAJ_A, group_id=0), _trajectory(*TRAJ_B, group_id=1)], pad_token_id=0
    )
    # Row A: sys(1,2) u(10) r(20,21) c(9) u(11,12) r(22) c(9)
    assert batch.input_ids[0].tolist() == [1, 2, 10, 20, 21, 9, 11, 12, 22, 9]
    assert batch.generated_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0]
    # Row B is padded to the same length.
    assert batch.input_ids[1].tolist() == [1, 2, 13, 23, 24, 25, 9, 0, 0, 0]
    assert batch.attention_mask[1].tolist() == [1] * 7 + [0] * 3
    assert batch.sampling_logp[0, 3].item() == -20.0
    # Trajectory layout: generated tokens in turn order, rewards on turn ends.
    assert batch.trajectories.generated_mask.tolist() == [[True, True, True], [True, True, True]]
    assert batch.trajectories.turn_rewards.tolist() == [[0.0, 0.5, -1.0], [0.0, 0.0, 2.0]]
    assert batch.trajectories.turn_ends.tolist() == [[False, True, True], [False, False, True]]
    assert batch.trajectories.group_ids.tolist() == [0, 1]


def test_rows_and_trajectories_round_trip():
    batch = build_token_batch(
        [_trajectory(*TRAJ_A, group_id=0), _trajectory(*TRAJ_B, group_id=0)], pad_token_id=0
    )
    traj_values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    rows = batch.to_rows(traj_values)
    assert rows[0].tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 3, 0]
    assert torch.equal(batch.to_trajectories(rows), traj_values)


def test_history_window_gives_one_row_per_turn_in_turn_order():
    batch = build_token_batch([_trajectory(*TRAJ_A, group_id=0, window=0)], pad_token_id=0)
    assert batch.input_ids.shape[0] == 2
    assert batch.input_ids[1].tolist()[:5] == [1, 2, 11, 12, 22]  # window 0: no earlier turn
    values = batch.to_trajectories(batch.input_ids.float())
    assert values.tolist() == [[20.0, 21.0, 22.0]]  # response tokens in order across rows


def test_reward_count_must_match_turns():
    with pytest.raises(ValueError, match="rewards"):
        build_token_batch([_trajectory(TRAJ_A[0], [1.0], group_id=0)], pad_token_id=0)


O, TH, AN = 0, 1, 2  # SPAN_OTHER, SPAN_THINK, SPAN_ANSWER


def assert_close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor([expected], dtype=torch.float32), rtol=0, atol=1e-6)


# One trajectory, two turns of 4 tokens: think think answer <eos> | think answer answer <eos>.
LABELS = torch.tensor([[TH, TH, AN, O, TH, AN, AN, O]])
MASK = torch.ones(1, 8, dtype=torch.bool)
TURN_ENDS = torch.tensor([[False, False, False, True, False, False, False, True]])
REWARDS = torch.tensor([[0, 0, 0, 0.5, 0, 0, 0, 1.0]])  # turn rewards on each turn's <eos>
VALUES = torch.arange(1.0, 9.0)[None]  # v = 1..8
SPANS = TokenSpans(generated_mask=MASK, turn_ends=TURN_ENDS, labels=LABELS)
SELECTED = {
    "all": [1, 1, 1, 1, 1, 1, 1, 1],
    "think_and_answer": [1, 1, 1, 0, 1, 1, 1, 0],
    "answer_only": [0, 0, 1, 0, 0, 1, 1, 0],
}


@pytest.mark.parametrize("policy", sorted(SELECTED))
def test_builtin_policies_select_their_spans(policy):
    assert build_token_mask(policy, SPANS).int().tolist() == [SELECTED[policy]]


def _advantages(policy: str, estimator: str, **hparams):
    inputs = AdvantageInputs(
        rewards=REWARDS, generated_mask=MASK, values=VALUES, turn_ends=TURN_ENDS, advantage_mask=build_token_mask(policy, SPANS)
    )
    return compute_advantages(estimator, inputs, **hparams)


# GAE, gamma = 1, lambda_ = 0.5: A_i = r_i + v_next - v_i + 0.5 * A_next over the selected tokens only;
# a reward on an unselected token moves to the last selected token before it.
# "all":              t7: 1 - 8 = -7; t6: 8 - 7 - 3.5 = -2.5; t5: 7 - 6 - 1.25 = -0.25; t4: 6 - 5 - 0.125 = 0.875;
#                     t3: 0.5 + 5 - 4 + 0.4375 = 1.9375; t2: 1 + 0.96875; t1: 1 + 0.984375; t0: 1 + 0.9921875
# "think_and_answer": rewards move 3 -> 2 and 7 -> 6; chain 0 1 2 4 5 6:
#                     t6: 1 - 7 = -6; t5: 7 - 6 - 3 = -2; t4: 6 - 5 - 1 = 0; t2: 0.5 + 5 - 3 + 0 = 2.5;
#                     t1: 3 - 2 + 1.25 = 2.25; t0: 2 - 1 + 1.125 = 2.125
# "answer_only":      chain 2 5 6: t6: -6; t5: 7 - 6 - 3 = -2; t2: 0.5 + 6 - 3 - 1 = 2.5
GAE_BY_HAND = {
    "all": ([1.9921875, 1.984375, 1.96875, 1.9375, 0.875, -0.25, -2.5, -7.0],
            [2.9921875, 3.984375, 4.96875, 5.9375, 5.875, 5.75, 4.5, 1.0]),
    "think_and_answer": ([2.125, 2.25, 2.5, 0, 0, -2.0, -6.0, 0], [3.125, 4.25, 5.5, 0, 5.0, 4.0, 1.0, 0]),
    "answer_only": ([0, 0, 2.5, 0, 0, -2.0, -6.0, 0], [0, 0, 5.5, 0, 0, 4.0, 1.0, 0]),
}


@pytest.mark.parametrize("policy", sorted(GAE_BY_HAND))
def test_gae_honours_the_advantage_mask_by_hand(policy):
    advantages, returns = _advantages(policy, "gae", gamma=1.0, lambda_=0.5)
    assert_close(advantages, GAE_BY_HAND[policy][0])
    assert_close(returns, GAE_BY_HAND[policy][1])


# Bi-level GAE, turn level gh = 0.5 with lambda 0, token level gamma = lambda_ = 1 (a token's
# advantage is its turn's return G_k minus its value); a turn ends at its last selected token.
# "all":              ends 3, 7: G_2 = 1; G_1 = 0.5 + 0.5 * v_7 = 4.5 -> 4.5 - v | 1 - v
# "think_and_answer": ends 2, 6: G_2 = 1; G_1 = 0.5 + 0.5 * v_6 = 4   -> 4 - v on 0..2 | 1 - v on 4..6
# "answer_only":      ends 2, 6: G_1 = 4 on token 2 | 1 - v on tokens 5, 6
BI_LEVEL_BY_HAND = {
    "all": ([3.5, 2.5, 1.5, 0.5, -4, -5, -6, -7], [4.5, 4.5, 4.5, 4.5, 1, 1, 1, 1]),
    "think_and_answer": ([3, 2, 1, 0, -4, -5, -6, 0], [4, 4, 4, 0, 1, 1, 1, 0]),
    "answer_only": ([0, 0, 1, 0, 0, -5, -6, 0], [0, 0, 4, 0, 0, 1, 1, 0]),
}


@pytest.mark.parametrize("policy", sorted(BI_LEVEL_BY_HAND))
def test_bi_level_gae_honours_the_advantage_mask_by_hand(policy):
    advantages, returns = _advantages(
        policy, "bi_level_gae", gamma=1.0, lambda_=1.0, high_level_gamma=0.5, high_level_lambda=0.0
    )
    assert_close(advantages, BI_LEVEL_BY_HAND[policy][0])
    assert_close(returns, BI_LEVEL_BY_HAND[policy][1])


def test_critic_free_advantages_are_zeroed_off_the_mask():
    # One trajectory: arpo broadcasts its score 1.5 to the selected tokens only.
    advantages, _ = _advantages("answer_only", "arpo")
    assert_close(advantages, [0, 0, 1.5, 0, 0, 1.5, 1.5, 0])


def test_restrict_to_advantage_mask_moves_rewards_back_and_drops_those_before_any_kept_token():
    # Turn 1 (tokens 0-1) has nothing selected: its reward 0.5 has no earlier state and is dropped;
    # turn 2's reward 1 on token 3 moves to token 2, which becomes the turn's end.
    rewards, mask, ends = restrict_to_advantage_mask(
        torch.tensor([[0, 0.5, 0, 1.0]]), torch.ones(1, 4), torch.tensor([[0, 0, 1, 0]]),
        torch.tensor([[0, 1, 0, 1]]),
    )
    assert rewards.tolist() == [[0, 0, 1.0, 0]]
    assert mask.tolist() == ends.tolist() == [[False, False, True, False]]


# PPO at ratio 1 gives -A per token; token-mean over the policy mask with A = 1..8:
# all: -36 / 8; think_and_answer: -(1 + 2 + 3 + 5 + 6 + 7) / 6; answer_only: -(3 + 6 + 7) / 3
LOSS_BY_HAND = {"all": -4.5, "think_and_answer": -4.0, "answer_only": -16 / 3}


@pytest.mark.parametrize("policy", sorted(LOSS_BY_HAND))
def test_policy_loss_counts_only_the_loss_mask_by_hand(policy):
    logp = torch.zeros(1, 8)
    loss, _ = policy_loss(logp, logp, torch.arange(1.0, 9.0)[None], build_token_mask(policy, SPANS))
    assert loss.item() == pytest.approx(LOSS_BY_HAND[policy])


def test_micro_batches_are_weighted_by_loss_mask_tokens():
    # Row 0 has 1 loss-mask token, row 1 has 3: with token-mean the micro-batches weigh 1/4 and 3/4.
    batch = {
        ATTENTION_MASK: torch.ones(2, 4, dtype=torch.long),
        GENERATED_MASK: torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]]),
        Columns.LOSS_MASK: torch.tensor([[0, 0, 1, 0], [0, 1, 1, 1]]),
    }
    weights = [float(w) for _, w in micro_batch_weights(batch, 1, "token-mean")]
    assert weights == [0.25, 0.75]


def test_response_token_spans_follow_the_parser():
    think = ProtocolSettings()
    tokens = ["<think>", "go", " left", "</", "think><answer>", "Left", "</answer>", ""]
    # A token straddling the blocks belongs to the answer; the empty end-of-turn token to neither.
    assert response_token_spans(tokens, config=think) == [TH, TH, TH, TH, AN, AN, AN, O]
    prefilled = ProtocolSettings(prefill=True)  # "<think>" is in the prompt, not among the tokens
    assert response_token_spans(tokens[1:], config=prefilled) == [TH, TH, TH, AN, AN, AN, O]
    assert response_token_spans(["I", " think", " Left"], config=think) == [O, O, O]  # malformed
    no_think = ProtocolSettings(think=False)
    assert response_token_spans(["<answer>", "Up", "</answer>", "\n"], config=no_think) == [AN, AN, AN, O]


class _CharTokenizer:
    """Token id i decodes to VOCAB[i]; id 0 is the special end-of-turn token (decoded as "")."""

    VOCAB = ("", "<think>", "hm", "</think>", "<answer>", "Up", "</answer>")

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.VOCAB[i] for i in ids)


def test_span_labeller_labels_each_turn_from_token_ids():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 0, 2, 4, 5, 6, 0]])  # turn 2 has no <think>: malformed
    ends = torch.zeros(1, 12, dtype=torch.bool)
    ends[0, 6] = ends[0, 11] = True
    spans = ResponseSpanLabeller(_CharTokenizer(), ProtocolSettings())(ids, torch.ones(1, 12, dtype=torch.bool), ends)
    assert spans.labels.tolist() == [[TH, TH, TH, AN, AN, AN, O] + [O] * 5]


def test_registering_a_custom_policy_and_clear_errors():
    register_token_mask("turn_ends_only", lambda spans: spans.turn_ends)
    try:
        assert build_token_mask("turn_ends_only", SPANS).tolist() == TURN_ENDS.tolist()
        with pytest.raises(ValueError, match="already exists"):
            register_token_mask("turn_ends_only", lambda spans: spans.generated_mask)
    finally:
        unregister_token_mask("turn_ends_only")
    assert "turn_ends_only" not in TOKEN_MASKS
    with pytest.raises(KeyError, match=r"unknown token mask policy 'nope'.*answer_only"):
        build_token_mask("nope", SPANS)
    with pytest.raises(ValueError, match="needs span labels"):
        build_token_mask("answer_only", TokenSpans(generated_mask=MASK, turn_ends=TURN_ENDS))
    with pytest.raises(TypeError, match="callable"):
        register_token_mask("bad", "answer_only")


@pytest.mark.parametrize("setting", ["loss_token_mask", "advantage_token_mask"])
def test_config_names_the_unknown_policy_and_the_known_ones(setting):
    with pytest.raises(ValueError, match=rf"{setting} must be one of .*'answer_only'.*got 'answers'"):
        StarPOConfig().training(**{setting: "answers"})
