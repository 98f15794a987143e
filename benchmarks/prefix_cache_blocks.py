"""vLLM's CPU prefix cache at KV blocks of 128 tokens (its CPU default) against 32 (this project's).

Prefix caching shares whole KV blocks only. One rollout turn of the CPU preset is 16 groups x 4
prompts: a group's members share their whole prompt on the first turn (and later, where they
acted alike), and every prompt starts with the same instructions (76 tokens in FrozenLake's
readable variant). Each side runs in a fresh process with its own `vllm.LLM` (SmolLM2-135M, bf16,
prefix caching on, 0.75 GiB KV cache, 64 sequences) and times one `generate` call of 12 tokens
per prompt, the median of `--repeats`, for:
  group_turn   16 distinct prompts (76 shared tokens + 101 of their own), each 4 times;
  distinct     64 distinct prompts with the same 76 shared tokens.

    python benchmarks/prefix_cache_blocks.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per case and side")
    parser.add_argument("--block-size", type=int, help=argparse.SUPPRESS)  # one side, JSON on stdout
    return parser.parse_args(argv)


def measure(block_size: int, repeats: int) -> dict[str, float]:
    import random

    import torch
    import vllm
    from vllm.inputs import TokensPrompt

    from rllib_ragen.models import resolve_model

    torch.set_num_threads(os.cpu_count() or 1)
    llm = vllm.LLM(
        model=str(resolve_model("smollm2-135m-instruct")), skip_tokenizer_init=True, dtype="bfloat16",
        max_model_len=512, enable_prefix_caching=True, kv_cache_memory_bytes=int(0.75 * 2**30), max_num_seqs=64,
        block_size=block_size, seed=0,
    )
    rng = random.Random(0)
    shared = [rng.randrange(100, 40000) for _ in range(76)]

    def prompts(n: int) -> list[list[int]]:
        return [shared + [rng.randrange(100, 40000) for _ in range(101)] for _ in range(n)]

    def seconds(batch: list[list[int]]) -> float:
        params = vllm.SamplingParams(max_tokens=12, temperature=1.0, logprobs=0, detokenize=False, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)
        return time.perf_counter() - start

    cases = {"group_turn": lambda: [p for p in prompts(16) for _ in range(4)], "distinct": lambda: prompts(64)}
    for make in cases.values():
        seconds(make())  # warm-up (and the shared tokens' blocks cached, as after an iteration's first turn)
    return {name: statistics.median(seconds(make()) for _ in range(repeats)) for name, make in cases.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.block_size:
        print(json.dumps(measure(args.block_size, args.repeats)))
        return
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="ERROR", HF_HUB_OFFLINE="1")
    sides = {}
    for block_size in (128, 32):
        command = [sys.executable, __file__, "--block-size", str(block_size), "--repeats", str(args.repeats)]
        out = subprocess.run(command, check=True, env=env, stdout=subprocess.PIPE, text=True).stdout
        sides[block_size] = json.loads(out.strip().splitlines()[-1])
        print(f"blocks of {block_size:>3}: " + ", ".join(f"{k} {v:.2f} s" for k, v in sides[block_size].items()), flush=True)
    for case in sides[128]:
        print(f"{case}, blocks of 32 / 128: x{sides[128][case] / sides[32][case]:.2f} faster")


if __name__ == "__main__":
    main()
