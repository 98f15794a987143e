"""The learner's fast path equals the naive computation.

Naive reference: the whole batch padded, a full [B, L, vocab] float32
log-softmax at every position, one forward/backward. The fast path (chunked,
recomputed log-probs at generated positions only; token-budget micro-batches of
length-sorted rows; optional bf16 autocast) must give the same loss and gradient.
"""


from __future__ import annotations

import copy
import ctypes
import logging

import gymnasium as gym
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.columns import (
    ATTENTION_MASK,
    GENERATED_MASK,
    INPUT_IDS,
    OLD_LOGP,
    SAMPLING_LOGP,
    TOKEN_ENTROPY,
    TOKEN_LOGP,
)
from rllib_ragen.rllib_private import learner_parameters
from rllib_ragen.training.learner import _glibc, micro_batch_weights, phase_peak, release_freed_memory
from rllib_ragen.training.losses import aggregate_loss, policy_loss
from rllib_ragen.training.module import ScoringSettings

SPACE = gym.spaces.Text(max_length=8)
ENTROPY_COEFF = 0.01


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Five right-padded rows of different lengths, generated spans in each."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [23, 9, 17, 30, 12]
    width = max(lengths)
    input_ids = torch.randint(1, 500, (len(lengths), width), generator=generator)
    attention = torch.zeros(len(lengths), width, dtype=torch.long)
    loss_mask = torch.zeros_like(attention)
    for row, length in enumerate(lengths):
        attention[row, :length] = 1
        loss_mask[row, length // 2 : length - 1] = 1  # a response, then a closing token
    input_ids = input_ids * attention
    advantages = torch.randn(attention.shape, generator=generator) * loss_mask
    return {INPUT_IDS: input_ids, ATTENTION_MASK: attention, GENERATED_MASK: loss_mask,
            Columns.ADVANTAGES: advantages}


def _learner(model_path, **training):
    config = (
        StarPOConfig()
        .llm(model=str(model_path), critic="none")
        .training(advantage_estimator="grpo", entropy_coeff=ENTROPY_COEFF, actor_lr=0.0, grad_clip=None,
                  **training)
    )
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (SPACE, SPACE)})
    return learner, learner.module[DEFAULT_MODULE_ID]


def _with_old_logp(batch: dict[str, torch.Tensor], old_logp: torch.Tensor) -> dict[str, torch.Tensor]:
    # Old log-probs a little off the current ones, so the PPO ratio is not 1 everywhere.
    shifted = (old_logp + 0.05 * torch.sin(torch.arange(old_logp.numel()).reshape(old_logp.shape))).detach()
    shifted = shifted * batch[GENERATED_MASK]
    return {**batch, OLD_LOGP: shifted, SAMPLING_LOGP: shifted}


def _naive_loss(policy, batch: dict[str, torch.Tensor], agg: str) -> torch.Tensor:
    logits = policy(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    pad = torch.zeros_like(logp_all[:, :1, 0])
    logp = torch.cat([pad, logp_all.gather(-1, batch[INPUT_IDS][:, 1:, None]).squeeze(-1)], dim=1)
    entropy = torch.cat([pad, -(logp_all.exp() * logp_all).sum(-1)], dim=1)
    mask = batch[GENERATED_MASK]
    pg, _ = policy_loss(logp, batch[OLD_LOGP], batch[Columns.ADVANTAGES], mask, loss_agg_mode=agg)
    return pg - ENTROPY_COEFF * aggregate_loss(entropy, mask, loss_agg_mode=agg)


def _update(learner, batch) -> tuple[float, dict[str, torch.Tensor]]:
    """One learner update (lr 0, no clipping): its loss and the accumulated gradients."""
    _, losses, _ = learner.update_minibatch({DEFAULT_MODULE_ID: batch})
    module = learner.module[DEFAULT_MODULE_ID]
    return float(losses[DEFAULT_MODULE_ID]), {n: p.grad.clone() for n, p in module.policy.named_parameters()}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_fast_fp32_update_equals_the_naive_one(tiny_model_path, agg):
    learner, module = _learner(tiny_model_path, micro_batch_tokens=40, logit_chunk_size=7, loss_agg_mode=agg)
    naive_policy = copy.deepcopy(module.policy)
    with torch.no_grad():
        batch = _with_old_logp(_batch(), module.forward_train(_batch())[TOKEN_LOGP])
    assert len(micro_batch_weights(batch, 4, agg, token_budget=40)) >= 3  # really split
    loss, grads = _update(learner, batch)
    expected = _naive_loss(naive_policy, batch, agg)
    expected.backward()
    assert loss == pytest.approx(float(expected.detach()), abs=1e-6)
    for name, param in naive_policy.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_token_budget_micro_batches_give_the_one_big_batch_gradient(tiny_model_path):
    batch = _batch(seed=1)
    one_batch, module = _learner(tiny_model_path, micro_batch_size=100)
    budget, budget_module = _learner(tiny_model_path, micro_batch_tokens=35)
    budget_module.load_state_dict(module.state_dict())
    with torch.no_grad():
        batch = _with_old_logp(batch, module.forward_train(batch)[TOKEN_LOGP])
    loss, grads = _update(one_batch, batch)
    budget_loss, budget_grads = _update(budget, batch)
    assert budget_loss == pytest.approx(loss, abs=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(budget_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_bf16_autocast_loss_is_within_tolerance_of_fp32(tiny_model_path):
    """bf16 autocast rounds the trunk's activations: loss within 1e-3 absolute of fp32."""
    learner, module = _learner(tiny_model_path, micro_batch_tokens=60)
    bf16_learner, bf16_module = _learner(tiny_model_path, micro_batch_tokens=60, autocast_dtype="bfloat16")
    bf16_module.load_state_dict(module.state_dict())
    with torch.no_grad():
        batch = _with_old_logp(_batch(), module.forward_train(_batch())[TOKEN_LOGP])
        fp32_logp = module.forward_train(batch)[TOKEN_LOGP]
        bf16_logp = bf16_module.forward_train(batch)[TOKEN_LOGP]
    assert not torch.equal(fp32_logp, bf16_logp)  # autocast really ran
    torch.testing.assert_close(bf16_logp, fp32_logp, atol=2e-2, rtol=0)
    loss, _ = _update(learner, batch)
    bf16_loss, _ = _update(bf16_learner, batch)
    assert bf16_loss == pytest.approx(loss, abs=1e-3)


def test_the_lm_head_under_autocast_scores_and_trains_within_bf16_tolerance_of_a_float32_head(tiny_model_path):
    """`autocast_lm_head` rounds the logits to bf16 before the float32 log-softmax: the same log-probs and
    loss within bf16 tolerance of the float32 head under the same trunk autocast, and a gradient as close."""
    learner, module = _learner(tiny_model_path, micro_batch_tokens=60, autocast_dtype="bfloat16")
    head_learner, head_module = _learner(
        tiny_model_path, micro_batch_tokens=60, autocast_dtype="bfloat16", autocast_lm_head=True
    )
    head_module.load_state_dict(module.state_dict())
    assert head_module.scoring.autocast_lm_head and not module.scoring.autocast_lm_head
    with torch.no_grad():
        batch = _with_old_logp(_batch(), module.forward_train(_batch())[TOKEN_LOGP])
        logp = module.forward_train(batch)[TOKEN_LOGP]
        head_logp = head_module.forward_train(batch)[TOKEN_LOGP]
    assert not torch.equal(logp, head_logp)  # the head really ran in bf16
    torch.testing.assert_close(head_logp, logp, atol=2e-2, rtol=0)
    loss, grads = _update(learner, batch)
    head_loss, head_grads = _update(head_learner, batch)
    assert head_loss == pytest.approx(loss, abs=1e-3)
    for name, grad in grads.items():
        torch.testing.assert_close(head_grads[name], grad, atol=2e-2 * grad.abs().max().item() + 1e-6, rtol=0)


def test_autocast_lm_head_needs_an_autocast_dtype():
    with pytest.raises(ValueError, match="autocast_lm_head needs an autocast_dtype"):
        ScoringSettings(autocast_lm_head=True)


@pytest.mark.parametrize("chunk_size", [5, 4096], ids=["chunks-recomputed", "one-chunk-kept"])
def test_chunked_scores_and_gradients_match_a_full_softmax(tiny_model_path, chunk_size):
    """Several chunks (each checkpointed, its logits recomputed in backward) and one chunk (kept) alike."""
    _, module = _learner(tiny_model_path)
    module.scoring = ScoringSettings(logit_chunk_size=chunk_size)
    reference = copy.deepcopy(module.policy)
    batch = _batch()
    out = module.forward_train(batch)
    (out[TOKEN_LOGP].sum() + out[TOKEN_ENTROPY].sum()).backward()
    logits = reference(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    mask = batch[GENERATED_MASK][:, 1:].bool()
    logp = logp_all.gather(-1, batch[INPUT_IDS][:, 1:, None]).squeeze(-1)[mask]
    entropy = -(logp_all.exp() * logp_all).sum(-1)[mask]
    torch.testing.assert_close(out[TOKEN_LOGP][:, 1:][mask], logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[TOKEN_ENTROPY][:, 1:][mask], entropy, atol=1e-5, rtol=1e-5)
    (logp.sum() + entropy.sum()).backward()
    for (name, param), ref in zip(module.policy.named_parameters(), reference.parameters()):
        torch.testing.assert_close(param.grad, ref.grad, atol=1e-5, rtol=1e-4, msg=name)


def _optimiser_learner(model_path):
    config = StarPOConfig().llm(model=str(model_path), critic="none").training(
        advantage_estimator="grpo", actor_lr=1e-3, weight_decay=0.1, grad_clip=None
    )
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (SPACE, SPACE)})


def _seeded_gradients(learner) -> dict:
    generator = torch.Generator().manual_seed(3)
    params = learner_parameters(learner)
    return {ref: torch.randn(p.shape, generator=generator) for ref, p in params.items()}


def test_an_optimiser_step_is_plain_adamws_and_a_nan_gradient_still_gets_rllibs_handling(tiny_model_path, caplog):
    learner = _optimiser_learner(tiny_model_path)
    params = learner_parameters(learner)
    gradients = _seeded_gradients(learner)
    # The reference: torch's unfused AdamW, one step from the same weights and gradients.
    copies = {ref: p.detach().clone().requires_grad_() for ref, p in params.items()}
    reference = torch.optim.AdamW(copies.values(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1, foreach=False)
    for ref, copy_ in copies.items():
        copy_.grad = gradients[ref].clone()
    reference.step()
    learner.apply_gradients(gradients)
    for ref, p in params.items():
        torch.testing.assert_close(p.detach(), copies[ref].detach(), rtol=1e-5, atol=1e-6)
    # A nan anywhere: RLlib's handling (torch_skip_nan_gradients=False zeroes it, with its warning).
    gradients = _seeded_gradients(learner)
    first = next(iter(gradients))
    gradients[first][0] = float("nan")
    with caplog.at_level(logging.WARNING):
        learner.apply_gradients(gradients)
    assert "contain `nan/inf` values" in caplog.text
    assert all(torch.isfinite(p).all() for p in params.values())


def test_config_errors():
    with pytest.raises(ValueError, match="autocast_dtype"):
        ScoringSettings(autocast_dtype="int8")
    with pytest.raises(ValueError, match="logit_chunk_size"):
        ScoringSettings(logit_chunk_size=0)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        StarPOConfig().training(micro_batch_tokens=0).validate_starpo()
    with pytest.raises(ValueError, match="autocast_dtype"):
        StarPOConfig().training(autocast_dtype="fp8").validate_starpo()


BLOCK = 64 * 1024  # below glibc's mmap threshold: from the heap, kept there once freed
BLOCKS = 4096  # 256 MiB


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_released_heap_pages_leave_the_resident_set():
    libc = _glibc()
    assert libc is not None, "this test needs glibc (Linux)"
    libc.malloc.restype = ctypes.c_void_p
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)  # touch every page
    for block in blocks[:-1]:  # the last block pins the heap's top, so free() alone trims nothing
        libc.free(ctypes.c_void_p(block))
    held = _resident_bytes()
    assert release_freed_memory()
    released = _resident_bytes()
    libc.free(ctypes.c_void_p(blocks[-1]))
    assert held - released > 200 * 2**20, (held, released)


def test_each_phase_reports_its_own_peak():
    """A phase that touches 400 MiB peaks at least that far above the resident set it started from; the
    next phase, which allocates nothing, peaks near its own start: a peak that were not reset per
    phase would still show the first phase's."""
    with phase_peak() as busy:
        start = _resident_bytes()
        block = torch.ones(100 * 2**20, dtype=torch.float32)  # 400 MiB, every page touched
        del block
    release_freed_memory()
    with phase_peak() as idle:
        idle_start = _resident_bytes()
    assert busy["bytes"] - start > 380 * 2**20, (busy, start)
    assert idle["bytes"] - idle_start < 50 * 2**20, (idle, idle_start)
    assert busy["bytes"] - idle["bytes"] > 300 * 2**20, (busy, idle)
