"""Rollout throughput: generated tokens/s of each engine on the same prompts, and weight-sync time.

Measures, for one model and one batch of chat prompts (sampling at temperature 1,
no stop tokens, so every completion is exactly --max-new-tokens long):
  (a) Hugging Face: `transformers` `generate` batched, and this library's `HFEngine`;
  (b) the vLLM engine pool (`VLLMEnginePool`);
and this machine's compute ceiling (a bf16 and an fp32 matmul probe), then the time
to push the policy weights into the pool (and that the pool then agrees with the
HF model). The rollout measurements are the entries of `throughput_measurements`;
(c) is a full StarPO rollout on Sokoban through `LLMEnvRunner` on the same pool settings.

    python benchmarks/rollout_throughput.py --num-prompts 64 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import ray
import torch

from envs.user_errors import CLIParser, front_door
from rllib_ragen.inference.engine import (
    InferenceEngine,
    SamplingParams,
    left_pad,
)
from rllib_ragen.inference.engine_factory import make_engine
from rllib_ragen.inference.engine_settings import EngineSettings
from rllib_ragen.inference.hf_engine import HFEngine
from rllib_ragen.models import load_causal_lm, load_tokenizer, resolve_model

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "How many legs does a spider have?",
    "Write a haiku about the sea.",
    "Explain what a prime number is.",
    "Which planet is closest to the sun?",
    "Give me a synonym for 'happy'.",
    "What is 12 times 12?",
]


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every measurement shares: the model, its prompts, the sampling settings."""

    model_path: Path
    prompts: list[list[int]]
    params: SamplingParams
    args: argparse.Namespace


@dataclasses.dataclass(frozen=True)
class Throughput:
    name: str
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or model dir (resolve_model)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-engines", type=int, default=1, help="vLLM actors in the pool")
    parser.add_argument("--threads", type=int, default=None, help="threads per engine (default: cores / engines)")
    parser.add_argument("--vllm-dtype", default="bfloat16", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--hf-batch-size", type=int, default=64, help="HF prompts per forward")
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--compile", action="store_true", help="vLLM with torch.compile (slower start)")
    parser.add_argument("--sync-repeats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3, help="turns per trajectory in the StarPO rollout (c)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="(c) without vLLM prefix caching (a group shares its prompt; turns extend it)")
    parser.add_argument("--skip", default="",
                        help="comma-separated measurements to skip: hf-generate,hf-engine,vllm,starpo-rollout")
    return parser.parse_args(argv)


def chat_prompts(model_path: Path, n: int) -> list[list[int]]:
    """n chat-templated prompts (the questions cycled), as token ids."""
    tokenizer = load_tokenizer(model_path)
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False))
        for i in range(n)
    ]


def matmul_gflops(dtype: torch.dtype, *, size: int = 1024, seconds: float = 2.0) -> float:
    """Sustained GFLOP/s of square matmuls in `dtype` on all of torch's threads."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - start) / 1e9


def time_engine(name: str, engine: InferenceEngine, setup: Setup) -> Throughput:
    """Generated tokens/s of one `generate` call over all prompts, after a small warm-up."""
    engine.generate(setup.prompts[:2], dataclasses.replace(setup.params, max_new_tokens=4))
    start = time.perf_counter()
    completions = engine.generate(setup.prompts, setup.params)
    seconds = time.perf_counter() - start
    return Throughput(name, sum(len(c.token_ids) for c in completions), seconds)


def measure_hf_generate(setup: Setup) -> Throughput:
    """(a) transformers' own batched `generate` (sampling, fixed length)."""
    model = load_causal_lm(setup.model_path)
    pad = model.config.pad_token_id
    ids, mask = left_pad(setup.prompts, pad_token_id=pad)
    tokens, start = 0, time.perf_counter()
    with torch.no_grad():
        for lo in range(0, len(ids), setup.args.hf_batch_size):
            hi = lo + setup.args.hf_batch_size
            out = model.generate(
                input_ids=ids[lo:hi], attention_mask=mask[lo:hi], do_sample=True, temperature=1.0, top_p=1.0,
                top_k=0, max_new_tokens=setup.params.max_new_tokens, min_new_tokens=setup.params.max_new_tokens,
                pad_token_id=pad,
            )
            tokens += (out.shape[1] - ids.shape[1]) * out.shape[0]
    return Throughput("HF transformers generate", tokens, time.perf_counter() - start)


def measure_hf_engine(setup: Setup) -> Throughput:
    """(a) this library's in-process HFEngine (KV cache, processed log-probs)."""
    engine = HFEngine(setup.model_path, max_batch_size=setup.args.hf_batch_size)
    return time_engine("HFEngine (fp32)", engine, setup)


def measure_vllm_pool(setup: Setup) -> Throughput:
    """(b) the vLLM engine pool, then the weight-sync time and a post-sync agreement check."""
    engine = make_engine(vllm_config(setup.args), setup.model_path)
    try:
        result = time_engine(f"vLLM pool ({setup.args.num_engines} x {setup.args.vllm_dtype})", engine, setup)
        report_weight_sync(engine, setup)
    finally:
        engine.shutdown()
    return result


def measure_starpo_rollout(setup: Setup) -> Throughput:
    """(c) a full StarPO rollout on Sokoban through `LLMEnvRunner` on the same vLLM pool settings:
    prompt building, one batched engine call per turn, answer parsing, env steps, episodes."""
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.rollout.env_runner import LLMEnvRunner

    args = setup.args
    group_size = 8
    config = (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(setup.model_path), critic="none")
        .rollouts(n_groups=max(1, args.num_prompts // group_size), group_size=group_size, max_turns=args.turns,
                  response_length=args.max_new_tokens, temperature=1.0)
        .inference(engine="vllm", num_engines=args.num_engines, engine_threads=args.threads,
                   engine_dtype=args.vllm_dtype, kv_cache_gb=args.kv_cache_gb, max_model_len=2048,
                   enable_prefix_caching=not args.no_prefix_caching)
        .training(advantage_estimator="grpo")
    )
    runner = LLMEnvRunner(config=config)
    try:
        start = time.perf_counter()
        episodes = runner.sample()
        seconds = time.perf_counter() - start
    finally:
        runner.stop()
    tokens = sum(len(a) for e in episodes for sa in e.agent_episodes.values() for a in sa.get_actions())
    timing = runner.last_rollout_timing
    print(f"StarPO rollout: {timing['engine_s']:.1f} s of {timing['total_s']:.1f} s inside engine calls "
          f"(framework overhead {1 - timing['engine_s'] / timing['total_s']:.1%}; the rest of the gap to the raw "
          f"pool is the engine prefilling multi-turn prompts)")
    return Throughput(f"StarPO rollout via LLMEnvRunner (Sokoban, {args.turns} turns)", tokens, seconds)


def throughput_measurements() -> dict[str, Callable[[Setup], Throughput]]:
    """The rollout measurements, by --skip name, run in this order and compared in the summary."""
    return {
        "hf-generate": measure_hf_generate,
        "hf-engine": measure_hf_engine,
        "vllm": measure_vllm_pool,
        "starpo-rollout": measure_starpo_rollout,
    }


def vllm_config(args: argparse.Namespace) -> EngineSettings:
    return EngineSettings(
        kind="vllm", num_engines=args.num_engines, num_threads=args.threads, dtype=args.vllm_dtype,
        kv_cache_gb=args.kv_cache_gb, max_model_len=2048, enforce_eager=not args.compile,
        num_cpus_per_engine=0,
    )


def report_weight_sync(engine: InferenceEngine, setup: Setup) -> None:
    """Times `update_weights` with a changed fp32 HF state dict; checks the pool then follows HF.

    The engine may run in bf16, so its log-probs differ from the fp32 HF model's
    by bf16 noise: the sync is right when that gap stays at its pre-sync level
    while the probe's log-probs themselves move by much more.
    """
    model = load_causal_lm(setup.model_path)
    hf = HFEngine(model)
    probe = ([setup.prompts[0]], [setup.prompts[1][-8:]])
    hf_before, engine_before = hf.score(*probe)[0], engine.score(*probe)[0]
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(0.02 * parameter.std() * torch.randn_like(parameter))
    seconds = []
    for _ in range(setup.args.sync_repeats):
        engine.update_weights(model.state_dict())
        seconds.append(engine.last_sync_seconds)
    megabytes = engine.last_sync_nbytes / 2**20
    print(f"weight sync ({megabytes:.0f} MB fp32 -> {setup.args.num_engines} engine(s)): "
          f"mean {np.mean(seconds):.2f} s, min {np.min(seconds):.2f} s over {len(seconds)}")
    hf_after, engine_after = hf.score(*probe)[0], engine.score(*probe)[0]

    def gap(a: list[float], b: list[float]) -> float:
        return float(np.max(np.abs(np.subtract(a, b))))

    print(f"probe log-probs moved by {gap(hf_after, hf_before):.3f} (HF); max |engine - HF| "
          f"before sync {gap(engine_before, hf_before):.3f}, after {gap(engine_after, hf_after):.3f} "
          f"(engine {setup.args.vllm_dtype})")


@front_door
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_path = resolve_model(args.model, progress=True)
    setup = Setup(model_path, chat_prompts(model_path, args.num_prompts),
                  SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0), args)
    print(f"model {model_path.name}: {args.num_prompts} prompts x {args.max_new_tokens} new tokens, "
          f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    print(f"compute ceiling: bf16 matmul {matmul_gflops(torch.bfloat16):.0f} GFLOP/s, "
          f"fp32 matmul {matmul_gflops(torch.float32):.0f} GFLOP/s")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    skip = set(filter(None, args.skip.split(",")))
    results = {}
    for name, measure in throughput_measurements().items():
        if name not in skip:
            results[name] = measure(setup)
            r = results[name]
            print(f"{r.name}: {r.tokens} tokens in {r.seconds:.1f} s = {r.tokens_per_s:.0f} tokens/s")
    ray.shutdown()
    if "vllm" in results:
        for name in ("hf-generate", "hf-engine"):
            if name in results:
                ratio = results["vllm"].tokens_per_s / results[name].tokens_per_s
                print(f"ratio vLLM pool / {results[name].name}: {ratio:.2f}")
        if "starpo-rollout" in results:
            ratio = results["starpo-rollout"].tokens_per_s / results["vllm"].tokens_per_s
            print(f"ratio StarPO rollout / raw vLLM pool (tokens/s, different prompt lengths): {ratio:.2f}")


if __name__ == "__main__":
    main()
