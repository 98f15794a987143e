"""Policy/value losses, entropy, KL and token log-probs checked by hand and against torch references."""


from __future__ import annotations

import math

import pytest
import torch

from rllib_ragen.logits import logprobs_and_entropies, token_logprobs
from rllib_ragen.training.losses import (
    OffPolicyCorrectionSettings,
    aggregate_loss,
    kl_penalty,
    masked_importance_weights,
    policy_loss,
    truncated_importance_weights,
    value_loss,
)

# One row of 7 tokens: ratios 1.1 (inside the clip range), 1.5 (above 1 + 0.28),
# 0.5 (below 1 - 0.2) with A = +2, then the same three and 4.0 (above clip_ratio_dual = 3) with A = -2.
RATIOS = torch.tensor([[1.1, 1.5, 0.5, 1.1, 1.5, 0.5, 4.0]])
ADVANTAGES = torch.tensor([[2.0, 2.0, 2.0, -2.0, -2.0, -2.0, -2.0]])
MASK = torch.ones(1, 7)
# Per-token pg = max(-A*r, -A*clip(r, 0.8, 1.28)), then min(pg, -A*3) where A < 0:
#   A=+2: r=1.1 -> max(-2.2, -2.2) = -2.2 ; r=1.5 -> max(-3.0, -2.56) = -2.56 (clipped high)
#         r=0.5 -> max(-1.0, -1.6) = -1.0
#   A=-2: r=1.1 -> 2.2 ; r=1.5 -> max(3.0, 2.56) = 3.0 ; r=0.5 -> max(1.0, 1.6) = 1.6 (clipped low)
#         r=4.0 -> max(8.0, 2.56) = 8.0, dual clip min(8.0, 6.0) = 6.0
PER_TOKEN = [-2.2, -2.56, -1.0, 2.2, 3.0, 1.6, 6.0]


def _policy_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log(RATIOS).requires_grad_()
    return logp, torch.zeros_like(RATIOS)


def test_policy_loss_clip_regions_by_hand():
    logp, old_logp = _policy_inputs()
    loss, stats = policy_loss(logp, old_logp, ADVANTAGES, MASK)
    assert loss.item() == pytest.approx(sum(PER_TOKEN) / 7)  # 7.04 / 7
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 7)
    assert stats["clip_frac_low"].item() == pytest.approx(1 / 7)
    assert stats["clip_frac_dual"].item() == pytest.approx(1 / 7)
    assert stats["ratio_mean"].item() == pytest.approx(10.2 / 7)  # 2*(1.1 + 1.5 + 0.5) + 4
    # mean(old - new) = -(2 ln 1.1 + 2 ln 1.5 + 2 ln 0.5 + ln 4) / 7 = -ln(0.825^2 * 4) / 7
    assert stats["approx_kl"].item() == pytest.approx(-math.log(0.825**2 * 4) / 7)


def test_policy_loss_gradient_vanishes_only_where_clipped():
    logp, old_logp = _policy_inputs()
    loss, _ = policy_loss(logp, old_logp, ADVANTAGES, MASK)
    loss.backward()
    # Unclipped tokens: d(-A * exp(logp)) / d logp = -A * r, divided by 7 tokens.
    expected = [-2.2, 0.0, -1.0, 2.2, 3.0, 0.0, 0.0]
    torch.testing.assert_close(logp.grad, torch.tensor([expected]) / 7)


def test_policy_loss_without_dual_clip():
    logp, old_logp = _policy_inputs()
    loss, stats = policy_loss(logp, old_logp, ADVANTAGES, MASK, clip_ratio_dual=None)
    # The last token keeps its unclipped 8.0 instead of 6.0.
    assert loss.item() == pytest.approx((sum(PER_TOKEN) - 6.0 + 8.0) / 7)
    assert stats["clip_frac_dual"].item() == 0.0


def test_policy_loss_symmetric_clip():
    logp, old_logp = _policy_inputs()
    # clip_ratio_high = 0.2: r=1.5 with A=+2 gives max(-3.0, -2*1.2) = -2.4 instead of -2.56.
    loss, _ = policy_loss(logp, old_logp, ADVANTAGES, MASK, clip_ratio_high=0.2)
    assert loss.item() == pytest.approx((sum(PER_TOKEN) + 2.56 - 2.4) / 7)


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        # Rows: [-1, -2, -3], [-4], and an empty row (left out).
        ("token-mean", (-1 - 2 - 3 - 4) / 4),  # -2.5
        ("seq-mean-token-mean", (-2 + -4) / 2),  # row means -2 and -4 -> -3
        ("seq-mean-token-sum", (-6 + -4) / 2),  # row sums -6 and -4 -> -5
    ],
)
def test_policy_loss_aggregations(agg, expected):
    # ratio 1 everywhere, so each token's loss is -A; padding holds large advantages that must not count.
    advantages = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    logp = torch.zeros(3, 3)
    loss, _ = policy_loss(logp, logp, advantages, mask, loss_agg_mode=agg)
    assert loss.item() == pytest.approx(expected)


def test_policy_loss_rejects_bad_settings():
    logp, old_logp = _policy_inputs()
    with pytest.raises(ValueError, match="clip_ratio_dual .* must be > 1"):
        policy_loss(logp, old_logp, ADVANTAGES, MASK, clip_ratio_dual=1.0)
    with pytest.raises(ValueError, match="clip_ratio_low must be in"):
        policy_loss(logp, old_logp, ADVANTAGES, MASK, clip_ratio_low=1.0)
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_loss(logp, MASK, loss_agg_mode="mean")
    with pytest.raises(ValueError, match="advantages must have shape"):
        policy_loss(logp, old_logp, ADVANTAGES[:, :3], MASK)


# Four tokens, clip 0.5:
#   old=1, v=1.2, R=2: unclipped 0.64, clipped v 1.2 -> 0.64            max 0.64
#   old=1, v=2,   R=2: unclipped 0,    clipped v 1.5 -> 0.25            max 0.25 (clipped term wins)
#   old=1, v=0,   R=2: unclipped 4,    clipped v 0.5 -> 2.25            max 4
#   old=0, v=1,   R=0: unclipped 1,    clipped v 0.5 -> 0.25            max 1
VALUES = torch.tensor([[1.2, 2.0, 0.0, 1.0, 7.0]])
OLD_VALUES = torch.tensor([[1.0, 1.0, 1.0, 0.0, 7.0]])
RETURNS = torch.tensor([[2.0, 2.0, 2.0, 0.0, -7.0]])
ADVANTAGE_MASK = torch.tensor([[1, 1, 1, 1, 0]])


def test_value_loss_clipped_by_hand():
    loss, stats = value_loss(VALUES, OLD_VALUES, RETURNS, ADVANTAGE_MASK, value_clip=0.5)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.25 + 4 + 1) / 4)  # 0.73625
    assert stats["vf_clip_frac"].item() == pytest.approx(1 / 4)
    # R - v = [0.8, 0, 2, -1]: biased var 1.2075; R = [2, 2, 2, 0]: biased var 0.75 -> 1 - 1.61
    assert stats["vf_explained_var"].item() == pytest.approx(-0.61)


def test_value_loss_unclipped_by_hand():
    loss, stats = value_loss(VALUES, OLD_VALUES, RETURNS, ADVANTAGE_MASK, value_clip=None)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0 + 4 + 1) / 4)  # 0.705
    assert stats["vf_clip_frac"].item() == 0.0
    with pytest.raises(ValueError, match="value_clip must be > 0"):
        value_loss(VALUES, OLD_VALUES, RETURNS, ADVANTAGE_MASK, value_clip=0.0)


def test_token_logprobs_equals_log_softmax_gather():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 7))
    ours = token_logprobs(logits, labels, chunk_size=3)  # chunks of 3, 3, 1 positions
    reference = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, reference)
    (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
    (grad_ref,) = torch.autograd.grad(reference.sum(), logits)
    torch.testing.assert_close(grad_ours, grad_ref)


def test_token_logprobs_upcasts_bf16():
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 50).bfloat16()
    labels = torch.randint(0, 50, (1, 4))
    ours = token_logprobs(logits, labels)
    assert ours.dtype == torch.float32
    reference = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, reference)


def test_logprobs_and_entropies_by_hand_and_against_a_categorical():
    # Uniform over 4 tokens: log p = -ln 4, H = ln 4; one certain token: log p = 0, H = 0.
    hand = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    logp, entropy = logprobs_and_entropies(hand, torch.tensor([2, 0]))
    torch.testing.assert_close(logp, torch.tensor([-math.log(4), 0.0]))
    torch.testing.assert_close(entropy, torch.tensor([math.log(4), 0.0]))
    # Temperature 2 on logits (ln 3, 0): probabilities (sqrt 3, 1) / (sqrt 3 + 1).
    logp, _ = logprobs_and_entropies(torch.tensor([[math.log(3), 0.0]]), torch.tensor([0]), temperature=2.0)
    assert logp.item() == pytest.approx(math.log(math.sqrt(3) / (math.sqrt(3) + 1)))
    torch.manual_seed(0)
    logits, labels = torch.randn(6, 13).bfloat16(), torch.randint(0, 13, (6,))
    logp, entropy = logprobs_and_entropies(logits, labels, temperature=0.7)
    reference = torch.distributions.Categorical(logits=logits.float() / 0.7)
    assert logp.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(logp, reference.log_prob(labels))
    torch.testing.assert_close(entropy, reference.entropy())


def test_entropies_stay_float32_under_the_learners_bf16_autocast():
    """The learner calls this under bf16 autocast; near collapse the entropy (about 0.01) is smaller than a
    bf16 rounding of sum(p * s) for logits of a trained model's size (25-30), so that sum must stay float32."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 1000, generator=generator)
    # Each row: token 0 all but certain (logit about 30), a runner-up (about 24), the rest near 0:
    # H about 0.02, E about 30.
    logits[:, 0] += 30.0
    logits[:, 1] += 24.0
    labels = torch.zeros(64, dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, entropy = logprobs_and_entropies(logits, labels)
    reference = torch.distributions.Categorical(logits=logits.double()).entropy()
    torch.testing.assert_close(entropy.double(), reference, atol=2e-4, rtol=0)  # float32 cancellation in lse - E


@pytest.mark.parametrize("outputs", ["both", "logp", "entropy"])
def test_the_written_out_gradient_equals_autograds_of_the_formulas(outputs):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 11, dtype=torch.float64, generator=generator, requires_grad=True)
    labels = torch.randint(0, 11, (5,), generator=generator)
    weights = torch.randn(2, 5, dtype=torch.float64, generator=generator)

    def objective(logp, entropy):
        terms = {"logp": (weights[0] * logp).sum(), "entropy": (weights[1] * entropy).sum()}
        return sum(terms.values()) if outputs == "both" else terms[outputs]

    (ours,) = torch.autograd.grad(objective(*logprobs_and_entropies(logits, labels, temperature=1.3)), logits)
    scaled = logits / 1.3
    log_probs = torch.log_softmax(scaled, dim=-1)
    naive = objective(log_probs.gather(-1, labels[:, None]).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1))
    (reference,) = torch.autograd.grad(naive, logits)
    torch.testing.assert_close(ours.double(), reference)


def test_logprobs_and_entropies_refuse_bad_shapes_and_temperatures():
    with pytest.raises(ValueError, match=r"need logits \[N, V\] and labels \[N\]"):
        logprobs_and_entropies(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        logprobs_and_entropies(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), temperature=0.0)


def test_kl_penalty_kinds_by_hand():
    # policy p = 0.5, reference 0.25: d = logp - ref = ln 2
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    ln2 = math.log(2)
    assert kl_penalty(logp, ref, kl_type="k1").item() == pytest.approx(ln2)
    assert kl_penalty(logp, ref, kl_type="k3").item() == pytest.approx(0.5 + ln2 - 1)  # e^-d + d - 1
    assert kl_penalty(ref, logp, kl_type="abs").item() == pytest.approx(ln2)
    assert kl_penalty(logp, ref, kl_type="mse").item() == pytest.approx(0.5 * ln2**2)
    with pytest.raises(ValueError, match="unknown kl_type 'k2'"):
        kl_penalty(logp, ref, kl_type="k2")


# Two rows of three tokens; the last token of row 1 is padding.
RATIO_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# log(pi_old / pi_engine) per token: row 0 ratios 1, 1.5, 3; row 1 ratios 0.5, 0.25.
LOG_RATIO = torch.tensor([[0.0, math.log(1.5), math.log(3.0)], [math.log(0.5), math.log(0.25), 7.0]])
OLD_LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
SAMPLING_LOGP = OLD_LOGP - LOG_RATIO


def test_tis_weights_are_ratios_capped_per_token():
    weights, stats = truncated_importance_weights(OLD_LOGP, SAMPLING_LOGP, RATIO_MASK, tis_cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.5, 2.0], [0.5, 0.25, 0.0]]))
    assert stats["is_ratio_mean"].item() == pytest.approx((1 + 1.5 + 3 + 0.5 + 0.25) / 5)
    assert stats["is_ratio_max"].item() == pytest.approx(3.0)
    assert stats["is_clipped_frac"].item() == pytest.approx(1 / 5)


def test_mis_masks_rows_by_geometric_mean_ratio():
    # Row 0: (1 * 1.5 * 3) ** (1/3) = 1.651 is inside [0.5, 2]; row 1: (0.5 * 0.25) ** (1/2) = 0.354 is not.
    weights, stats = masked_importance_weights(OLD_LOGP, SAMPLING_LOGP, RATIO_MASK, mis_low=0.5, mis_high=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert stats["is_masked_frac"].item() == pytest.approx(0.5)
    # A band that takes 0.354 but not 1.651 keeps only row 1, on its two real tokens.
    weights, _ = masked_importance_weights(OLD_LOGP, SAMPLING_LOGP, RATIO_MASK, mis_low=0.3, mis_high=1.6)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))


def test_unknown_engine_logp_counts_as_on_policy():
    sampling = SAMPLING_LOGP.clone()
    sampling[0, 2] = float("nan")  # e.g. a demonstration token
    weights, stats = truncated_importance_weights(OLD_LOGP, sampling, RATIO_MASK, tis_cap=2.0)
    assert weights[0, 2].item() == 1.0
    assert stats["is_clipped_frac"].item() == 0.0


def test_weighted_policy_loss_and_its_gradient():
    """At ratio 1 with A = 1 the token-mean loss is -mean(w); d loss / d logp_t = -w_t / 5."""
    logp = OLD_LOGP.clone().requires_grad_(True)
    weights, _ = OffPolicyCorrectionSettings(off_policy_correction="tis").weights(OLD_LOGP, SAMPLING_LOGP, RATIO_MASK)
    loss, _ = policy_loss(logp, OLD_LOGP, torch.ones(2, 3), RATIO_MASK, weights=weights)
    assert loss.item() == pytest.approx(-(1 + 1.5 + 2 + 0.5 + 0.25) / 5)
    loss.backward()
    torch.testing.assert_close(logp.grad, -weights / 5)
    unweighted, _ = policy_loss(OLD_LOGP, OLD_LOGP, torch.ones(2, 3), RATIO_MASK)
    assert unweighted.item() == pytest.approx(-1.0)


def test_none_gives_no_weights_and_bad_settings_are_named():
    assert OffPolicyCorrectionSettings().weights(OLD_LOGP, SAMPLING_LOGP, RATIO_MASK) == (None, {})
    with pytest.raises(ValueError, match="off_policy_correction"):
        OffPolicyCorrectionSettings(off_policy_correction="vtrace")
    with pytest.raises(ValueError, match="tis_cap"):
        OffPolicyCorrectionSettings(tis_cap=0.0)
    with pytest.raises(ValueError, match="mis_low"):
        OffPolicyCorrectionSettings(mis_low=1.5)


def test_the_learner_logs_the_correction(tiny_model_path, ray_session):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from tests.run_helpers import tiny_config

    config = tiny_config(tiny_model_path).training(off_policy_correction="tis").starpo_evaluation(eval_interval=0)
    algo = config.build_algo()
    try:
        learner = algo.train()["learners"][DEFAULT_MODULE_ID]
    finally:
        algo.stop()
    # The HF engine scores in float32 like the learner: the ratios are 1 up to float noise.
    assert learner["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert 1.0 <= learner["is_ratio_max"] < 1.01
    assert learner["is_clipped_frac"] == 0.0
