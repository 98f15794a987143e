"""HFEngine: outputs checked against hand-rolled decoding with the same HF model."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch

from rllib_ragen.inference.engine import SamplingParams, left_pad
from rllib_ragen.inference.engine_factory import make_engine
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.inference.hf_engine import HFEngine, draw_by_inverse_cdf, mask_top_p, processed_logprobs
from rllib_ragen.models import load_causal_lm

PROMPTS = [[1, 17, 930, 4021, 77, 5], [1, 2048], [1, 600, 601, 602, 603, 604, 605, 606, 607, 9], [3, 44, 45]]


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_causal_lm(tiny_model_path)


@pytest.fixture(scope="module")
def engine(model):
    return HFEngine(model, max_batch_size=3)


@torch.no_grad()
def manual_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy decoding without a KV cache, padding or batching: one full forward per token."""
    tokens, logprobs = list(prompt), []
    for _ in range(n):
        logp = model(torch.tensor([tokens])).logits[0, -1].float().log_softmax(-1)
        token = int(logp.argmax())
        tokens.append(token)
        logprobs.append(float(logp[token]))
    return tokens[len(prompt) :], logprobs


@torch.no_grad()
def manual_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """[len(completion), V] log_softmax(logits / T) at each completion position, one forward."""
    logits = model(torch.tensor([prompt + completion])).logits[0].float()
    return (logits[len(prompt) - 1 : -1] / temperature).log_softmax(-1)


def test_greedy_equals_manual_argmax_decode(model, engine):
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))
    for prompt, completion in zip(PROMPTS, completions):
        tokens, logprobs = manual_greedy(model, prompt, 6)
        assert completion.token_ids == tokens
        assert completion.logprobs == pytest.approx(logprobs, abs=1e-4)
        assert completion.finish_reason == "length"


def test_sampled_logprobs_are_after_temperature(model, engine):
    params = SamplingParams(max_new_tokens=5, temperature=0.7, seed=3)
    for prompt, completion in zip(PROMPTS, engine.generate(PROMPTS, params)):
        expected = manual_logprobs(model, prompt, completion.token_ids, 0.7)
        picked = expected.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        assert completion.logprobs == pytest.approx(picked.tolist(), abs=1e-4)
        # At T=0.7 the log-prob differs from the raw (T=1) one: the temperature is really applied.
        raw = manual_logprobs(model, prompt, completion.token_ids, 1.0)
        assert not torch.allclose(picked, raw.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1))


def test_top_p_logprobs_renormalise_over_the_nucleus(model, engine):
    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_p=0.2, seed=0)
    for prompt, completion in zip(PROMPTS, engine.generate(PROMPTS, params)):
        full = manual_logprobs(model, prompt, completion.token_ids, 1.0)
        for step, token in enumerate(completion.token_ids):
            probs, order = full[step].exp().sort(descending=True)
            # Nucleus: tokens whose strictly-more-likely mass is below top_p.
            kept = order[(probs.cumsum(0) - probs) < 0.2]
            assert token in kept.tolist()
            expected = full[step, token] - full[step, kept].logsumexp(0)
            assert completion.logprobs[step] == pytest.approx(float(expected), abs=1e-4)


def test_mask_top_p_by_hand():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    logp = processed_logprobs(logits, temperature=1.0, top_p=0.8).squeeze(0)
    assert logp[:2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert torch.isinf(logp[2:]).all()
    # top_p so small that only the argmax survives; top_p 1 keeps everything.
    assert torch.isfinite(mask_top_p(logits, 0.01)).tolist() == [[True, False, False, False]]
    assert torch.equal(mask_top_p(logits, 1.0), logits)


def test_inverse_cdf_draws_follow_the_probabilities_and_never_a_zero_one():
    probs = torch.tensor([[0.0, 0.5, 0.25, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0, 0.0]])
    n = 40_000
    draws = draw_by_inverse_cdf(probs.repeat(n, 1), generator=torch.Generator().manual_seed(0)).view(n, 3)
    # Row 0: frequencies 0.5 / 0.25 / 0.25 within 4 standard errors (sqrt(0.25 / 40000) = 0.0025).
    freq = torch.bincount(draws[:, 0], minlength=5).double() / n
    assert freq.tolist() == pytest.approx([0.0, 0.5, 0.25, 0.0, 0.25], abs=0.01)
    # Unnormalised rows whose only mass is at one end always draw that token.
    assert set(draws[:, 1].tolist()) == {4} and set(draws[:, 2].tolist()) == {0}


def test_inverse_cdf_draw_at_the_rows_total_is_the_last_token_with_mass(monkeypatch):
    """A uniform number that rounds up to the total would land past the end: it takes the last token with mass."""
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw["dtype"]))
    assert draw_by_inverse_cdf(torch.tensor([[0.2, 0.8, 0.0, 0.0]])).tolist() == [1]


def test_greedy_ignores_top_p_and_reports_temperature_one(model, engine):
    plain = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=3, temperature=0.0))
    nucleus = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=3, temperature=0.0, top_p=0.1))
    assert plain == nucleus


def test_stop_token_ends_a_completion_and_is_included(model, engine):
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))
    stop = greedy[0].token_ids[2]
    stopped = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(stop,)))
    for before, after in zip(greedy, stopped):
        if stop in before.token_ids:
            cut = before.token_ids.index(stop) + 1
            assert (after.token_ids, after.finish_reason) == (before.token_ids[:cut], "stop")
            assert after.logprobs == pytest.approx(before.logprobs[:cut], abs=1e-5)
        else:
            assert (after.token_ids, after.finish_reason) == (before.token_ids, "length")
    assert stopped[0].token_ids[-1] == stop and len(stopped[0].token_ids) <= 3


def test_rows_that_stop_early_leave_the_batch_without_mixing_up_the_others(model, engine):
    # A third of the vocabulary stops: rows finish at different steps and are pruned one by one.
    stops = tuple(range(0, model.config.vocab_size, 3))
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=stops, seed=1)
    completions = engine.generate(PROMPTS * 2, params)
    assert len({len(c.token_ids) for c in completions}) > 1
    for prompt, completion in zip(PROMPTS * 2, completions):
        expected = manual_logprobs(model, prompt, completion.token_ids, 1.0)
        picked = expected.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        assert completion.logprobs == pytest.approx(picked.tolist(), abs=1e-4)
        stopped = completion.token_ids[-1] in stops
        assert completion.finish_reason == ("stop" if stopped else "length")
        assert all(t not in stops for t in completion.token_ids[:-1])
        assert stopped or len(completion.token_ids) == 6


def test_mixed_length_batch_keeps_order_across_sub_batches(model):
    batched = HFEngine(model, max_batch_size=2).generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    alone = [HFEngine(model).generate([p], SamplingParams(max_new_tokens=4, temperature=0.0))[0] for p in PROMPTS]
    assert [c.token_ids for c in batched] == [c.token_ids for c in alone]
    for b, a in zip(batched, alone):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_seeded_sampling_repeats_and_identical_prompts_still_differ(engine):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    group = [PROMPTS[0]] * 4
    first, second = engine.generate(group, params), engine.generate(group, params)
    assert first == second
    assert len({tuple(c.token_ids) for c in first}) == 4


def test_score_equals_a_manual_forward(model, engine):
    continuations = [[5, 6, 7], [8], [100, 200], [9, 9, 9, 9]]
    scores = engine.score(PROMPTS, continuations)
    for prompt, continuation, score in zip(PROMPTS, continuations, scores):
        full = manual_logprobs(model, prompt, continuation, 1.0)
        expected = full.gather(-1, torch.tensor(continuation)[:, None]).squeeze(-1)
        assert score == pytest.approx(expected.tolist(), abs=1e-4)


def test_update_weights_in_place_including_the_tied_embedding(tiny_model_path):
    engine = HFEngine(tiny_model_path)
    assert engine.health()["last_sync_seconds"] is None  # no sync yet
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    before = engine.generate(PROMPTS, params)
    embedding = original["model.embed_tokens.weight"]
    engine.update_weights({"model.embed_tokens.weight": embedding + 0.5 * torch.randn_like(embedding)})
    # Tied: the LM head reads the same tensor, so changing the embedding changes it too.
    assert torch.equal(engine.model.lm_head.weight, engine.model.model.embed_tokens.weight)
    assert engine.generate(PROMPTS, params) != before
    start = time.perf_counter()
    engine.update_weights(original)
    sync_seconds = time.perf_counter() - start
    assert engine.generate(PROMPTS, params) == before
    # The health report gives the latest sync's duration.
    assert 0 < engine.health()["last_sync_seconds"] <= sync_seconds


def test_update_weights_rejects_unknown_names_and_wrong_shapes(engine):
    with pytest.raises(KeyError, match="not parameters"):
        engine.update_weights({"policy.model.norm.weight": torch.ones(64)})
    with pytest.raises(ValueError, match="wrong shape"):
        engine.update_weights({"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match="empty"):
        engine.update_weights({})


def test_bad_prompts_are_rejected_with_their_index(engine):
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1], []], params)
    with pytest.raises(ValueError, match="prompt 0 has token ids outside"):
        engine.generate([[1, 10**6]], params)
    with pytest.raises(ValueError, match="positions"):
        engine.generate([[1] * 10], SamplingParams(max_new_tokens=10**5))
    assert engine.generate([], params) == []


def test_num_threads_is_applied_and_bad_settings_rejected(model):
    saved = torch.get_num_threads()
    try:
        HFEngine(model, num_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(model, max_batch_size=0)


def test_left_pad_masks_the_padding():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


# ---------------------------------------------------------------- EngineSettings / make_engine


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": "tpu"}, "engine must be one of"),
        ({"dtype": "float64"}, "dtype must be one of"),
        ({"num_engines": 0}, "num_engines must be > 0"),
        ({"kv_cache_gb": 0}, "kv_cache_gb must be > 0"),
        ({"num_threads": 0}, "engine_threads must be > 0"),
        ({"num_gpus_per_engine": -1}, "must be >= 0"),
        ({"tensor_parallel_size": 2, "num_gpus_per_engine": 1}, "needs num_gpus_per_engine >= 2"),
    ],
)
def test_engine_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings(**overrides)


def test_threads_per_engine_splits_the_cores_unless_given():
    assert EngineSettings(num_threads=3, num_engines=2).threads_per_engine == 3
    assert EngineSettings(num_engines=2).threads_per_engine == max(1, os.cpu_count() // 2)
    assert EngineSettings(num_engines=10**4).threads_per_engine == 1


def test_make_engine_builds_the_hf_engine(tiny_model_path, tmp_path):
    engine = make_engine(EngineSettings(kind="hf", max_batch_size=4), tiny_model_path)
    assert isinstance(engine, HFEngine) and engine.max_batch_size == 4
    assert engine.health()["healthy"] and engine.health()["dtype"] == "torch.float32"
    with pytest.raises(FileNotFoundError, match="no config.json"):
        make_engine(EngineSettings(kind="hf"), tmp_path)
