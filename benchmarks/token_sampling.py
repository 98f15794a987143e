"""Time to draw one next token per row: torch.multinomial against the inverse-CDF draw the HF engine uses.

Prints both times per call and the ratio, measured in the same run on rows of
`--vocab` log-probabilities (SmolLM2's vocabulary by default).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rllib_ragen.inference.hf_engine import draw_by_inverse_cdf


def seconds_per_call(draws: dict, probs: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median seconds per call of each draw, the methods interleaved call by call so that both
    see the same machine state."""
    times: dict[str, list[float]] = {name: [] for name in draws}
    for _ in range(repeats + 1):  # the first round warms up
        for name, draw in draws.items():
            start = time.perf_counter()
            draw(probs)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values[1:]) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="rows drawn at once (the decode batch)")
    parser.add_argument("--vocab", type=int, default=49152, help="tokens a row (49152: SmolLM2)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per method (medians are reported)")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    probs = torch.randn(args.rows, args.vocab, generator=generator).softmax(dim=-1)
    timings = seconds_per_call({
        "multinomial": lambda p: torch.multinomial(p, num_samples=1, generator=generator),
        "inverse_cdf": lambda p: draw_by_inverse_cdf(p, generator=generator),
    }, probs, args.repeats)
    baseline, inverse_cdf = timings["multinomial"], timings["inverse_cdf"]
    print(f"[{args.rows} x {args.vocab}] torch.multinomial {baseline * 1e3:.1f} ms/call, "
          f"inverse CDF {inverse_cdf * 1e3:.1f} ms/call: x{baseline / inverse_cdf:.1f}")


if __name__ == "__main__":
    main()
