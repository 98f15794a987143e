"""VLLMEnginePool against the HF model it mirrors: outputs, weight sync (tied head), actor death.

The pool's engines load a tiny random Llama (fp32). A HF copy of the same weights
plays the learner: every test that changes weights changes the HF copy and
pushes it, so the pool always mirrors `learner` and can be compared with it.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
import torch
import transformers

from rllib_ragen.inference import engine_settings
from rllib_ragen.inference.engine import SamplingParams, pack_weights, unpack_weights
from rllib_ragen.inference.engine_factory import make_engine
from rllib_ragen.inference.engine_settings import EngineSettings, resolve_kind
from rllib_ragen.inference.hf_engine import HFEngine
from rllib_ragen.inference.vllm.pool import LOAD_STEP, VLLMEnginePool
from rllib_ragen.models import load_causal_lm, tiny_random_config

TOLERANCE = 1e-3  # max abs log-prob difference, vLLM fp32 vs HF fp32
PROMPTS = [[1, 17, 930, 4021, 77, 5], [1, 2048], [1, 600, 601, 602, 603, 604, 605, 606, 607, 9], [3, 44, 45], [1, 8]]
# Longer than vLLM's CPU KV block (128 tokens): its first blocks go into the prefix cache.
LONG_PROMPT = [1] + [(37 * i) % 5000 + 10 for i in range(299)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """tiny-random's config (head_dim 32, which vLLM's CPU attention supports).

    Its generation config names as eos the 2nd token greedy decoding of PROMPTS[0]
    produces: only `stop_token_ids` may end a completion, so an engine that stops
    there (vLLM does by default) fails the comparison with the HF engine.
    """
    config = tiny_random_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id = HFEngine(model).generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=2, temperature=0.0)
    )[0].token_ids[1]
    path = tmp_path_factory.mktemp("vllm_tiny")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(model_dir, ray_cluster):
    config = EngineSettings(
        kind="vllm", num_engines=2, kv_cache_gb=0.05, max_model_len=512, dtype="float32",
        num_threads=1, enable_prefix_caching=True,
    )
    engine = make_engine(config, model_dir)
    assert isinstance(engine, VLLMEnginePool)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def learner(model_dir):
    return load_causal_lm(model_dir)


@torch.no_grad()
def hf_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of `tokens` following `prompt`, from one forward of the HF model."""
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()


def max_diff(a: list[float], b: list[float]) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def assert_same_completions(got, want) -> None:
    """Same tokens and finish reasons; log-probs equal up to batch-shape float noise."""
    assert [(c.token_ids, c.finish_reason) for c in got] == [(c.token_ids, c.finish_reason) for c in want]
    for g, w in zip(got, want):
        assert max_diff(g.logprobs, w.logprobs) < 1e-5


def optimiser_step(model, prompt: list[int], continuation: list[int], lr: float) -> None:
    """One AdamW step raising log p(continuation | prompt): moves every weight, tied embedding included."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    logits = model(torch.tensor([prompt + continuation])).logits[0, len(prompt) - 1 : -1]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(continuation))
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    model.zero_grad(set_to_none=True)


@pytest.mark.vllm
def test_generate_keeps_order_and_matches_the_hf_engine(pool, learner):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    completions = pool.generate(PROMPTS, params)
    expected = HFEngine(learner).generate(PROMPTS, params)
    assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
    for got, want in zip(completions, expected):
        assert max_diff(got.logprobs, want.logprobs) < TOLERANCE
        assert got.finish_reason == "length"


@pytest.mark.vllm
def test_health_reports_live_engines_and_their_threads(pool):
    health = pool.health()
    assert health["healthy"] and health["live_engines"] == 2
    assert health["engine_threads"] == [1, 1]


@pytest.mark.vllm
def test_sampled_logprobs_are_after_temperature(pool, learner):
    completions = pool.generate(PROMPTS, SamplingParams(max_new_tokens=5, temperature=0.7, seed=5))
    for prompt, completion in zip(PROMPTS, completions):
        assert max_diff(completion.logprobs, hf_logprobs(learner, prompt, completion.token_ids, 0.7)) < TOLERANCE
        assert max_diff(completion.logprobs, hf_logprobs(learner, prompt, completion.token_ids, 1.0)) > 0.01


@pytest.mark.vllm
def test_seeded_output_does_not_depend_on_sharding(pool):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=100)
    group = [PROMPTS[0]] * 4 + PROMPTS
    together = pool.generate(group, params)
    assert_same_completions(pool.generate(group, params), together)
    # Prompt i is sampled with seed + i whichever engine gets it.
    alone = pool.generate([group[6]], SamplingParams(max_new_tokens=6, temperature=1.0, seed=106))
    assert_same_completions(alone, together[6:7])
    assert len({tuple(c.token_ids) for c in together[:4]}) == 4


@pytest.mark.vllm
def test_stop_token_ends_a_completion_and_is_included(pool):
    greedy = pool.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, temperature=0.0))
    stop = greedy[0].token_ids[2]
    stopped = pool.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(stop,)))
    cut = greedy[0].token_ids.index(stop) + 1
    assert (stopped[0].token_ids, stopped[0].finish_reason) == (greedy[0].token_ids[:cut], "stop")


@pytest.mark.vllm
def test_a_prompt_served_from_the_prefix_cache_reports_the_tokens_it_skipped(pool):
    prompt = [1] + list(range(3000, 3099))  # 100 tokens that no other test's prompt starts with
    greedy = SamplingParams(max_new_tokens=2, temperature=0.0)
    first = pool.generate([prompt, prompt], greedy)  # one copy to each engine
    again = pool.generate([prompt, prompt], greedy)
    assert [c.cached_prompt_tokens for c in first] == [0, 0]
    # Whole KV blocks of 32 tokens (the CPU block size), and never the last position, which must make logits.
    assert [c.cached_prompt_tokens for c in again] == [96, 96]
    assert [c.token_ids for c in again] == [c.token_ids for c in first]


@pytest.mark.vllm
def test_sync_after_an_optimiser_step_matches_the_learner(pool, learner):
    continuation = [500, 501, 502, 503, 504, 505]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    pool.generate([LONG_PROMPT], greedy)  # fills the prefix cache under the current weights
    before = pool.score([LONG_PROMPT], [continuation])[0]
    assert max_diff(before, hf_logprobs(learner, LONG_PROMPT, continuation)) < TOLERANCE

    embedding_before = learner.model.embed_tokens.weight.detach().clone()
    optimiser_step(learner, LONG_PROMPT, continuation, lr=1e-2)
    assert not torch.equal(learner.model.embed_tokens.weight, embedding_before)
    # named_parameters lists the tied tensor once, as model.embed_tokens.weight: no lm_head.weight is sent.
    pool.update_weights({name: p.detach() for name, p in learner.named_parameters()})

    after = pool.score([LONG_PROMPT], [continuation])[0]
    expected = hf_logprobs(learner, LONG_PROMPT, continuation)
    assert max_diff(after, before) > 0.1
    assert max_diff(after, expected) < TOLERANCE
    # Generation after the sync: no stale prefix KV from the old weights.
    got = pool.generate([LONG_PROMPT], greedy)[0]
    want = HFEngine(learner).generate([LONG_PROMPT], greedy)[0]
    assert got.token_ids == want.token_ids
    assert max_diff(got.logprobs, want.logprobs) < TOLERANCE
    assert pool.health()["last_sync_seconds"] > 0


@pytest.mark.vllm
def test_a_tied_head_only_change_reaches_the_logits(pool, learner):
    """Changes only the tied row of one token absent from the prompt: only the LM head sees it."""
    prompt, target = PROMPTS[0], 3333
    before = pool.score([prompt], [[target]])[0][0]
    with torch.no_grad():
        learner.model.embed_tokens.weight[target] += 0.5 * torch.randn(learner.config.hidden_size)
    pool.update_weights({"model.embed_tokens.weight": learner.model.embed_tokens.weight.detach()})
    after = pool.score([prompt], [[target]])[0][0]
    expected = hf_logprobs(learner, prompt, [target])[0]
    assert abs(after - before) > 0.01
    assert abs(after - expected) < TOLERANCE


@pytest.mark.vllm
def test_an_engine_killed_mid_call_is_replaced_with_current_weights(pool, learner, monkeypatch):
    with torch.no_grad():
        learner.model.norm.weight.mul_(1.5)  # weights the engines' checkpoint does not have
    pool.update_weights(dict(learner.state_dict()))
    prompts = [PROMPTS[i % len(PROMPTS)] + [i + 10] for i in range(16)]
    params = SamplingParams(max_new_tokens=96, temperature=1.0, seed=7)
    reference = pool.generate(prompts, params)
    restarts = pool.restarts

    # Engine 0 is busy with a task of its own, so its shard of the call queues behind it and cannot
    # finish; the engine is killed when the pool starts waiting for that shard, i.e. with every
    # shard of the call submitted and engine 0's still in flight, whatever the timing.
    victim = pool.actors[0]
    busy = victim.__ray_call__.remote(lambda _: time.sleep(300))
    waits, kills = [], []
    wait = pool._await

    def kill_engine_0_at_the_first_wait(rank, ref, *args):
        waits.append(rank)
        if rank == 0 and not kills:
            kills.append(victim)
            ray.kill(victim)
        return wait(rank, ref, *args)

    monkeypatch.setattr(pool, "_await", kill_engine_0_at_the_first_wait)
    result = pool.generate(prompts, params)
    monkeypatch.undo()

    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(busy, timeout=60)  # killed mid-task: the task in front of the shard never finished
    assert waits[0] == 0 and kills == [victim]  # killed once, at the call's first wait: on its shard
    assert pool.restarts == restarts + 1 and pool.actors[0] is not victim
    # Same completions as before the kill: every prompt done, in order, by engines with the synced weights.
    assert_same_completions(result, reference)
    assert pool.health()["healthy"]


@pytest.mark.vllm
def test_a_replacement_killed_while_it_starts_is_replaced_again_within_the_call(pool, learner, monkeypatch):
    pool.update_weights(dict(learner.state_dict()))  # the weights a replacement is restored to
    prompts = [PROMPTS[i % len(PROMPTS)] + [i + 10] for i in range(8)]
    params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=3)
    reference = pool.generate(prompts, params)
    restarts = pool.restarts
    pool.actors[0].__ray_call__.remote(lambda _: time.sleep(300))  # engine 0's shard cannot finish first
    waits, wait = [], pool._await

    def kill_engine_0_at_its_shard_and_at_its_first_replacements_start(rank, ref, step, *args):
        waits.append((rank, step))
        if rank == 0 and len([w for w in waits if w[0] == 0]) <= 2:
            ray.kill(pool.actors[0])
        return wait(rank, ref, step, *args)

    monkeypatch.setattr(pool, "_await", kill_engine_0_at_its_shard_and_at_its_first_replacements_start)
    result = pool.generate(prompts, params)
    monkeypatch.undo()

    assert [step for rank, step in waits if rank == 0] == ["generate", "starting", "starting", LOAD_STEP, "generate"]
    assert pool.restarts == restarts + 2  # the killed replacement counts: max_restarts_per_call=2 covers both
    assert_same_completions(result, reference)
    assert pool.health()["healthy"]


@pytest.mark.vllm
def test_an_engine_dead_before_a_sync_is_replaced_and_gets_the_new_weights(pool, learner):
    ray.kill(pool.actors[1])
    health = pool.health(timeout_s=5)
    assert not health["healthy"] and health["live_engines"] == 1
    with torch.no_grad():
        learner.model.layers[0].mlp.down_proj.weight.mul_(-1.0)
    restarts = pool.restarts
    pool.update_weights(dict(learner.state_dict()))
    assert pool.restarts == restarts + 1 and pool.health()["healthy"]
    # Prompts 3 and 4 land on the replaced engine (shards of 5 over 2 engines: 3 + 2).
    continuations = [[11, 12, 13]] * len(PROMPTS)
    for prompt, got in zip(PROMPTS, pool.score(PROMPTS, continuations)):
        assert max_diff(got, hf_logprobs(learner, prompt, [11, 12, 13])) < TOLERANCE


@pytest.mark.vllm
def test_bad_updates_and_prompts_are_rejected_before_reaching_the_engines(pool):
    with pytest.raises(KeyError, match="not parameters"):
        pool.update_weights({"policy.lm_head.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="wrong shape"):
        pool.update_weights({"model.norm.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="max_model_len=512"):
        pool.generate([[1] * 500], SamplingParams(max_new_tokens=20))
    with pytest.raises(ValueError, match="prompt 1 has token ids outside"):
        pool.generate([[1], [10**6]], SamplingParams(max_new_tokens=2))
    assert pool.generate([], SamplingParams()) == []


@pytest.mark.vllm
def test_a_model_vllm_cannot_run_fails_at_start_with_the_reason(tmp_path, ray_cluster):
    config = tiny_random_config()
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16  # no CPU kernel for 16
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    engine_settings = EngineSettings(
        kind="vllm", kv_cache_gb=0.05, max_model_len=256, num_threads=1, num_cpus_per_engine=0
    )
    with pytest.raises(RuntimeError, match="(?s)vLLM engine 0 failed to start.*head_dim=16"):
        VLLMEnginePool(tmp_path, engine_settings)


@pytest.mark.vllm
def test_auto_picks_vllm_when_importable():
    assert resolve_kind("auto") == "vllm"


def test_vllm_kind_without_vllm_says_which_extra_to_install(monkeypatch):
    monkeypatch.setattr(engine_settings, "vllm_available", lambda: False)
    assert resolve_kind("auto") == "hf"
    with pytest.raises(ImportError, match='"cpu" extra'):
        resolve_kind("vllm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_packed_weights_round_trip_through_the_object_store(dtype, ray_cluster):
    state = {"a": torch.randn(3, 4).to(dtype), "b.weight": torch.arange(5, dtype=torch.float32).to(dtype)}
    unpacked = dict(unpack_weights(ray.get(ray.put(pack_weights(state)))))
    assert list(unpacked) == list(state)
    for name, tensor in state.items():
        assert unpacked[name].dtype == dtype and torch.equal(unpacked[name], tensor)


def test_tied_weights_are_packed_once(model_dir):
    model = load_causal_lm(model_dir)
    packed = pack_weights(model.state_dict())
    assert "lm_head.weight" in model.state_dict() and "lm_head.weight" not in packed.names
    assert "model.embed_tokens.weight" in packed.names
    assert len(packed.names) == len(dict(model.named_parameters()))
