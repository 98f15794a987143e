"""Off-policy correction (`rllib_ragen.training.off_policy`): TIS and MIS weights on a batch computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_ragen.training.losses import policy_loss
from rllib_ragen.training.off_policy import (
    OffPolicyCorrectionSettings,
    masked_importance_weights,
    truncated_importance_weights,
)

# Two rows of three tokens; the last token of row 1 is padding.
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# log(pi_old / pi_engine) per token: row 0 ratios 1, 1.5, 3; row 1 ratios 0.5, 0.25.
LOG_RATIO = torch.tensor([[0.0, math.log(1.5), math.log(3.0)], [math.log(0.5), math.log(0.25), 7.0]])
OLD_LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
SAMPLING_LOGP = OLD_LOGP - LOG_RATIO


def test_tis_weights_are_ratios_capped_per_token():
    weights, stats = truncated_importance_weights(OLD_LOGP, SAMPLING_LOGP, MASK, tis_cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.5, 2.0], [0.5, 0.25, 0.0]]))
    assert stats["is_ratio_mean"].item() == pytest.approx((1 + 1.5 + 3 + 0.5 + 0.25) / 5)
    assert stats["is_ratio_max"].item() == pytest.approx(3.0)
    assert stats["is_clipped_frac"].item() == pytest.approx(1 / 5)


def test_mis_masks_rows_by_geometric_mean_ratio():
    # Row 0: (1 * 1.5 * 3) ** (1/3) = 1.651 is inside [0.5, 2]; row 1: (0.5 * 0.25) ** (1/2) = 0.354 is not.
    weights, stats = masked_importance_weights(OLD_LOGP, SAMPLING_LOGP, MASK, mis_low=0.5, mis_high=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert stats["is_masked_frac"].item() == pytest.approx(0.5)
    # A band that takes 0.354 but not 1.651 keeps only row 1, on its two real tokens.
    weights, _ = masked_importance_weights(OLD_LOGP, SAMPLING_LOGP, MASK, mis_low=0.3, mis_high=1.6)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))


def test_unknown_engine_logp_counts_as_on_policy():
    sampling = SAMPLING_LOGP.clone()
    sampling[0, 2] = float("nan")  # e.g. a demonstration token
    weights, stats = truncated_importance_weights(OLD_LOGP, sampling, MASK, tis_cap=2.0)
    assert weights[0, 2].item() == 1.0
    assert stats["is_clipped_frac"].item() == 0.0


def test_weighted_policy_loss_and_its_gradient():
    """At ratio 1 with A = 1 the token-mean loss is -mean(w); d loss / d logp_t = -w_t / 5."""
    logp = OLD_LOGP.clone().requires_grad_(True)
    weights, _ = OffPolicyCorrectionSettings(off_policy_correction="tis").weights(OLD_LOGP, SAMPLING_LOGP, MASK)
    loss, _ = policy_loss(logp, OLD_LOGP, torch.ones(2, 3), MASK, weights=weights)
    assert loss.item() == pytest.approx(-(1 + 1.5 + 2 + 0.5 + 0.25) / 5)
    loss.backward()
    torch.testing.assert_close(logp.grad, -weights / 5)
    unweighted, _ = policy_loss(OLD_LOGP, OLD_LOGP, torch.ones(2, 3), MASK)
    assert unweighted.item() == pytest.approx(-1.0)


def test_none_gives_no_weights_and_bad_settings_are_named():
    assert OffPolicyCorrectionSettings().weights(OLD_LOGP, SAMPLING_LOGP, MASK) == (None, {})
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
