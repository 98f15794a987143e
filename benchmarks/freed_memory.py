"""Resident memory of a learner between updates, with and without handing freed pages back to the OS.

Each side runs in a fresh process: SmolLM2-135M (float32 weights, bf16 autocast, fused AdamW) takes
`--steps` optimiser steps of three micro-batches each, Sokoban-sized rows (a 150-token shared prefix,
prompts of varying length, 12-token answers) whose shapes change every step, as a StarPO learner's do.
After each step one side calls `release_freed_memory()` (glibc's malloc_trim), the other does nothing.
Printed: the resident set after the last step (what the process holds while the rollout and the
evaluation run), its high-water mark, and their ratios.

    python benchmarks/freed_memory.py --steps 6
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="optimiser steps per side")
    parser.add_argument("--side", choices=["keep", "release"], help=argparse.SUPPRESS)  # one side, JSON on stdout
    return parser.parse_args(argv)


def _rows(generator, prefix, *, rows: int, prompts: int, middle: int, answer: int = 12) -> dict:
    import torch

    from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS

    distinct = [torch.cat([prefix, torch.randint(100, 40000, (middle,), generator=generator)]) for _ in range(prompts)]
    ids = torch.stack(
        [torch.cat([distinct[r % prompts], torch.randint(100, 40000, (answer,), generator=generator)]) for r in range(rows)]
    )
    generated = torch.zeros_like(ids)
    generated[:, -answer:] = 1
    return {INPUT_IDS: ids, ATTENTION_MASK: torch.ones_like(ids), GENERATED_MASK: generated}


def measure(side: str, steps: int) -> dict:
    import torch

    from rllib_ragen.columns import GENERATED_MASK, TOKEN_LOGP
    from rllib_ragen.models import load_causal_lm, resolve_model
    from rllib_ragen.training.learner import release_freed_memory
    from rllib_ragen.training.module import score_generated_tokens, trunk_hidden

    model = load_causal_lm(resolve_model("smollm2-135m-instruct"), dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, 40000, (150,), generator=generator)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for rows, prompts, middle in [(6, 3, 130 - step * 7), (8, 8, 100 + step * 5), (4, 2, 60 + step * 11)]:
            batch = _rows(generator, prefix, rows=rows, prompts=prompts, middle=middle)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                hidden = trunk_hidden(model.base_model, batch)
            logp = score_generated_tokens(model.get_output_embeddings(), hidden, batch, 1.0)[TOKEN_LOGP]
            (-(logp * batch[GENERATED_MASK]).sum()).backward()
        optimizer.step()
        if side == "release":
            release_freed_memory()
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1]) * 4096
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"resident_gb": resident / 2**30, "peak_gb": peak / 2**30}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side:
        print(json.dumps(measure(args.side, args.steps)))
        return
    sides = {}
    for side in ("keep", "release"):
        command = [sys.executable, __file__, "--side", side, "--steps", str(args.steps)]
        out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        sides[side] = json.loads(out.strip().splitlines()[-1])
        print(f"{side:>8}: resident after the last step {sides[side]['resident_gb']:.2f} GB, "
              f"peak {sides[side]['peak_gb']:.2f} GB", flush=True)
    for key in ("resident_gb", "peak_gb"):
        print(f"{key.removesuffix('_gb')}, release / keep: x{sides['release'][key] / sides['keep'][key]:.2f}")


if __name__ == "__main__":
    main()
