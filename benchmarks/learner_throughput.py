"""Learner throughput and peak memory: one StarPO update, naive vs this library's fast path.

The batch is a StarPO mini-batch of multi-turn Sokoban rows built with the real
protocol: each row is a trajectory of the repo's Sokoban env, its prompts rendered
by `PromptProtocol` with the model's chat template, and per turn a response of
exactly --response-tokens tokens (a `<think>` rationale + `<answer>` whose actions
are stepped in the env) under the loss mask. Advantages are random; old log-probs
are the current policy's, as right after a rollout.

One update = forward + backward + AdamW step (grad-norm clip 1.0) on that batch:
  naive      the whole mini-batch padded to its longest row in one pass, full
             [B, L, vocab] log-softmax and entropy at every position, float32;
  fast-fp32  `StarPOTorchLearner` with token-budget micro-batches of length-sorted
             rows and chunked, recomputed log-probs at generated positions only;
  fast       the same with bfloat16 autocast (weights, optimiser, LM head and
             log-softmax stay float32);
  lora8, lora64  fast-fp32 with LoRA adapters of rank 8 / 64 on every linear
             layer (PEFT, alpha = 2r): the base is frozen, AdamW holds the adapters only.
All variants use the same loss (PPO clip + entropy bonus, token-mean, no critic).

Weight sync: the learner's side of an object-store sync, timed after the
update: the policy's HF-named weights (LoRA merged in: W + (alpha/r) B A per
layer) packed into host arrays (`pack_weights`), and their size. LoRA variants
also time the adapter-only sync (`.inference(lora_sync="adapter")`: the adapter
tensors alone, which vLLM serves as a LoRA request). The engines' side is not
timed here.

Tokens/s counts the batch's real (non-pad) tokens per second of one update.
Trainable parameters: those with requires_grad (all of them without LoRA).
Peak memory: every variant runs in a fresh subprocess and reports its
`ru_maxrss` (the process's resident-set high-water mark, read by the kernel, so it
sees every allocation: torch's, the allocator's caches, Python's); it includes
the interpreter, torch, the model, gradients and AdamW state. Before the timed
update each process warms up with one update on the shortest row (which also
creates the AdamW state).

    python benchmarks/learner_throughput.py                  # naive, fast-fp32, fast
    python benchmarks/learner_throughput.py --rows 16 --micro-batch-tokens 4096
    python benchmarks/learner_throughput.py --variants fast-fp32,lora8,lora64   # LoRA vs full fine-tuning
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402

from envs import make_env  # noqa: E402
from envs.user_errors import CLIParser, front_door  # noqa: E402
from rllib_ragen.algorithm.starpo import StarPOConfig  # noqa: E402
from rllib_ragen.columns import (  # noqa: E402
    ATTENTION_MASK,
    GENERATED_MASK,
    INPUT_IDS,
    OLD_LOGP,
    SAMPLING_LOGP,
    TOKEN_LOGP,
)
from rllib_ragen.inference.engine import pack_weights  # noqa: E402
from rllib_ragen.models import load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from rllib_ragen.rollout.prompt.token_history import ChatTemplate  # noqa: E402
from rllib_ragen.rollout.prompt.prompt_protocol import PromptProtocol, ProtocolSettings  # noqa: E402
from rllib_ragen.rollout.prompt.token_history import TokenHistory  # noqa: E402
from rllib_ragen.rollout.trajectory_record import Trajectory  # noqa: E402
from rllib_ragen.training.losses import aggregate_loss, policy_loss  # noqa: E402
from rllib_ragen.training.token_batch import build_token_batch  # noqa: E402

VARIANTS = ("naive", "fast-fp32", "fast", "lora8", "lora64")
LORA_RANKS = {"lora8": 8, "lora64": 64}
# The full fine-tuning run LoRA variants are compared with (same learner path, float32).
FULL_FINE_TUNING = "fast-fp32"
ENTROPY_COEFF = 0.001
SPACE = gym.spaces.Text(max_length=8)


@dataclasses.dataclass(frozen=True)
class Result:
    """One variant's measurement (what its subprocess prints as JSON)."""

    variant: str
    seconds: float
    tokens: int
    generated_tokens: int
    loss: float
    rss_before_mb: float
    peak_rss_mb: float
    trainable_params: int
    sync_seconds: float
    sync_mb: float
    adapter_sync_seconds: float | None = None
    adapter_sync_mb: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or model dir")
    parser.add_argument("--rows", type=int, default=8, help="trajectories (rows) in the mini-batch")
    parser.add_argument("--min-turns", type=int, default=2, help="fewest turns of a trajectory")
    parser.add_argument("--max-turns", type=int, default=5, help="most turns of a trajectory")
    parser.add_argument("--response-tokens", type=int, default=48, help="generated tokens per turn")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048,
                        help="fast variants: distinct token positions per micro-batch")
    parser.add_argument("--logit-chunk-size", type=int, default=1024,
                        help="fast variants: generated positions whose logits exist at once")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="fast variants: recompute trunk activations in backward")
    parser.add_argument("--variants", default=",".join(VARIANTS[:3]),
                        help=f"comma-separated subset of {VARIANTS} (default: the first three)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    if not 1 <= args.min_turns <= args.max_turns:
        parser.error("need 1 <= --min-turns <= --max-turns")
    return args


# ------------------------------------------------------------------ the batch
def sokoban_trajectory(protocol: PromptProtocol, *, seed: int, turns: int, response_tokens: int) -> Trajectory:
    """A real Sokoban trajectory's tokens with scripted responses of exactly `response_tokens` tokens."""
    rng = np.random.default_rng(seed)
    env = make_env("sokoban")
    observation, _ = env.reset(seed=seed)
    tokenizer = protocol.template.tokenizer
    filler = tokenizer.encode(" I look at the player, the box and the target and plan the next moves." * 8,
                              add_special_tokens=False)
    history, rewards, reward = TokenHistory(protocol.system_ids), [], None
    for turn in range(turns):
        history.add_user(protocol.user_ids(observation, reward=reward, turns_left=turns - turn))
        actions = [str(rng.choice(env.action_vocabulary)) for _ in range(2)]
        head = tokenizer.encode("<think>", add_special_tokens=False)
        tail = tokenizer.encode(f"</think><answer>{' || '.join(actions)}</answer>", add_special_tokens=False)
        response = head + filler[: max(response_tokens - len(head) - len(tail), 0)] + tail
        response = response[:response_tokens]
        history.add_response(response, [0.0] * len(response), protocol.close_ids(response))
        reward = 0.0
        for action in actions:
            observation, step_reward, terminated, truncated, _ = env.step(action)
            reward += step_reward
        rewards.append(reward)
        if terminated or truncated:
            break
    return Trajectory(history, rewards, group_id=seed)


def sokoban_batch(model_path, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Token columns of --rows trajectories (old log-probs and advantages filled in later)."""
    protocol = PromptProtocol(
        ChatTemplate.from_tokenizer(load_tokenizer(model_path)),
        instructions=make_env("sokoban").instructions,
        action_vocabulary=make_env("sokoban").action_vocabulary,
        config=ProtocolSettings(),
    )
    rng = np.random.default_rng(args.seed)
    trajectories = [
        sokoban_trajectory(protocol, seed=args.seed * 1000 + i, turns=int(rng.integers(args.min_turns, args.max_turns + 1)),
                           response_tokens=args.response_tokens)
        for i in range(args.rows)
    ]
    tokens = build_token_batch(trajectories, pad_token_id=0)
    generator = torch.Generator().manual_seed(args.seed)
    advantages = torch.randn(tokens.generated_mask.shape, generator=generator) * tokens.generated_mask
    return {
        INPUT_IDS: tokens.input_ids,
        ATTENTION_MASK: tokens.attention_mask,
        GENERATED_MASK: tokens.generated_mask,
        Columns.ADVANTAGES: advantages,
    }


# ------------------------------------------------------------------ the naive update
def naive_token_scores(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of every next token from a full [B, L, vocab] float32 log-softmax, [B, L] each."""
    logits = model(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logp_all.gather(-1, batch[INPUT_IDS][:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    pad = torch.zeros_like(picked[:, :1])
    return torch.cat([pad, picked], dim=1), torch.cat([pad, entropy], dim=1)


def naive_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The StarPO loss (PPO clip + entropy bonus, token-mean) on the naive scores."""
    logp, entropy = naive_token_scores(model, batch)
    mask = batch[GENERATED_MASK]
    pg, _ = policy_loss(logp, batch[OLD_LOGP], batch[Columns.ADVANTAGES], mask)
    return pg - ENTROPY_COEFF * aggregate_loss(entropy, mask)


class NaiveUpdater:
    """Padded whole-batch fp32 update with the same AdamW and clipping as the learner."""

    def __init__(self, model_path) -> None:
        self.model = load_causal_lm(model_path).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6, weight_decay=0.01)

    def old_logp(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return naive_token_scores(self.model, batch)[0] * batch[GENERATED_MASK]

    def parameters(self):
        return self.model.parameters()

    def policy_weights(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def update(self, batch: dict[str, torch.Tensor]) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = naive_loss(self.model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return float(loss.detach())


# ------------------------------------------------------------------ the fast update
class FastUpdater:
    """This library's `StarPOTorchLearner`, driven one mini-batch at a time."""

    def __init__(self, model_path, args: argparse.Namespace, *, autocast_dtype: str | None, lora_rank: int) -> None:
        config = (
            StarPOConfig()
            .llm(model=str(model_path), critic="none", gradient_checkpointing=args.gradient_checkpointing,
                 lora_rank=lora_rank, lora_alpha=2.0 * max(lora_rank, 1))
            .training(
                advantage_estimator="grpo", entropy_coeff=ENTROPY_COEFF, actor_lr=1e-6,
                micro_batch_tokens=args.micro_batch_tokens, autocast_dtype=autocast_dtype,
                logit_chunk_size=args.logit_chunk_size,
            )
        )
        self.learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (SPACE, SPACE)})
        self.module = self.learner.module[DEFAULT_MODULE_ID]
        self.module.train()

    def old_logp(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return self.module.forward_train(batch)[TOKEN_LOGP]

    def parameters(self):
        return self.module.parameters()

    def policy_weights(self) -> dict[str, torch.Tensor]:
        return self.module.policy_state_dict()

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        return self.module.policy_state_dict(adapter=True)

    def update(self, batch: dict[str, torch.Tensor]) -> float:
        _, losses, _ = self.learner.update_minibatch({DEFAULT_MODULE_ID: batch})
        return float(losses[DEFAULT_MODULE_ID])


def rss_mb() -> float:
    """Current resident set size of this process, MB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_variant(args: argparse.Namespace) -> Result:
    """Warm-up update on the shortest row, then one timed update on the whole batch."""
    torch.manual_seed(args.seed)
    model_path = resolve_model(args.model)
    batch = sokoban_batch(model_path, args)
    if args.run_variant == "naive":
        updater = NaiveUpdater(model_path)
    else:
        updater = FastUpdater(model_path, args, autocast_dtype="bfloat16" if args.run_variant == "fast" else None,
                              lora_rank=LORA_RANKS.get(args.run_variant, 0))
    batch[OLD_LOGP] = updater.old_logp(batch)
    batch[SAMPLING_LOGP] = batch[OLD_LOGP]
    shortest = int(batch[ATTENTION_MASK].sum(1).argmin())
    length = int(batch[ATTENTION_MASK][shortest].sum())
    updater.update({k: v[shortest : shortest + 1, :length] for k, v in batch.items()})
    rss_before = rss_mb()
    start = time.perf_counter()
    loss = updater.update(batch)
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the sync's merged copies
    start = time.perf_counter()
    packed = pack_weights(updater.policy_weights())
    sync_seconds = time.perf_counter() - start
    adapter_sync = {}
    if args.run_variant in LORA_RANKS:
        start = time.perf_counter()
        adapter = pack_weights(updater.adapter_weights())
        adapter_sync = dict(adapter_sync_seconds=time.perf_counter() - start, adapter_sync_mb=adapter.nbytes / 2**20)
    trainable = sum(p.numel() for p in updater.parameters() if p.requires_grad)
    return Result(
        variant=args.run_variant, seconds=seconds, tokens=int(batch[ATTENTION_MASK].sum()),
        generated_tokens=int(batch[GENERATED_MASK].sum()), loss=loss, rss_before_mb=rss_before,
        peak_rss_mb=peak_rss, trainable_params=trainable,
        sync_seconds=sync_seconds, sync_mb=packed.nbytes / 2**20, **adapter_sync,
    )


def spawn(variant: str, argv: list[str]) -> Result:
    """Runs one variant in a fresh interpreter (its own ru_maxrss) and reads its JSON line."""
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--run-variant", variant]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Result(**json.loads(out.stdout.strip().splitlines()[-1]))


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(f"model {args.model}, {args.rows} Sokoban rows, {args.min_turns}-{args.max_turns} turns, "
          f"{args.response_tokens} generated tokens/turn, {torch.get_num_threads()} threads, "
          f"micro_batch_tokens={args.micro_batch_tokens}, logit_chunk_size={args.logit_chunk_size}, "
          f"gradient_checkpointing={args.gradient_checkpointing}")
    first = results[0]
    print(f"batch: {first.tokens} real tokens, {first.generated_tokens} under the loss mask")
    print("peak memory = ru_maxrss of a fresh subprocess per variant (interpreter + torch + model + grads + "
          "AdamW state + activations, read before the sync); 'before' = RSS after the warm-up update; "
          "sync = merging (LoRA) and packing the policy's weights for the engines; adapter = packing the LoRA "
          "adapter alone")
    print(f"{'variant':<10} {'update s':>9} {'tokens/s':>9} {'gen tok/s':>9} {'peak MB':>8} {'before MB':>9} "
          f"{'trainable':>11} {'sync s':>7} {'sync MB':>8} {'adapter s':>9} {'adapter MB':>10} {'loss':>12}")
    for r in results:
        print(f"{r.variant:<10} {r.seconds:>9.2f} {r.tokens_per_s:>9.1f} {r.generated_tokens / r.seconds:>9.1f} "
              f"{r.peak_rss_mb:>8.0f} {r.rss_before_mb:>9.0f} {r.trainable_params:>11,} {r.sync_seconds:>7.3f} "
              f"{r.sync_mb:>8.1f} {_or_dash(r.adapter_sync_seconds, '.3f'):>9} {_or_dash(r.adapter_sync_mb, '.1f'):>10} "
              f"{r.loss:>12.6f}")
    by_variant = {r.variant: r for r in results}
    naive, full = by_variant.get("naive"), by_variant.get(FULL_FINE_TUNING)
    for r in results:
        if naive is not None and r is not naive and r.variant not in LORA_RANKS:
            print(f"{r.variant} / naive: tokens/s x{r.tokens_per_s / naive.tokens_per_s:.2f}, "
                  f"peak memory x{r.peak_rss_mb / naive.peak_rss_mb:.2f}, "
                  f"loss difference {abs(r.loss - naive.loss):.2e}")
        if full is not None and r.variant in LORA_RANKS:
            print(f"{r.variant} / {FULL_FINE_TUNING}: update time x{r.seconds / full.seconds:.2f}, "
                  f"peak memory x{r.peak_rss_mb / full.peak_rss_mb:.2f}, "
                  f"trainable parameters x{r.trainable_params / full.trainable_params:.4f}, "
                  f"sync time x{r.sync_seconds / full.sync_seconds:.2f} merged, "
                  f"x{r.adapter_sync_seconds / full.sync_seconds:.3f} adapter only "
                  f"(size x{r.adapter_sync_mb / full.sync_mb:.4f})")


def _or_dash(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@front_door
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.run_variant:
        print(json.dumps(dataclasses.asdict(run_variant(args))))
        return
    results = [spawn(variant, argv) for variant in args.variants.split(",")]
    report(results, args)


if __name__ == "__main__":
    main()
