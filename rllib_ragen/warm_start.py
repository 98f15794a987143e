"""Supervised format warm start: teach a small model the answer format, not the task.

Small models (SmolLM2-135M, and of course a random tiny model) almost never
write `<think>...</think><answer>...</answer>` zero-shot, so RL sees no reward
signal at all. The warm start fine-tunes on first-turn prompts of the env
answered with well-formed answers whose actions are valid but drawn uniformly
at random: afterwards the model follows the format while its choices are still
random, so any later gain in success is the RL's doing.

The result is a model directory cached like the built-in models (built once,
safe against concurrent builders) and usable wherever a model name is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ray.rllib.core.columns import Columns

from envs import make_env
from rllib_ragen.advantages import masked_mean
from rllib_ragen.connectors.answer_parser import ACTION_SEPARATOR
from rllib_ragen.connectors.chat_template import ChatTemplate
from rllib_ragen.connectors.protocol import PromptProtocol, ProtocolConfig
from rllib_ragen.env_group import TurnBudget
from rllib_ragen.module import ATTENTION_MASK, INPUT_IDS, TOKEN_LOGP, score_generated_tokens, trunk_hidden
from rllib_ragen.models import BuiltinModel, default_cache_dir, load_causal_lm, load_tokenizer, prepare_builtin, resolve_model



@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """What the warm start trains on.

    Args:
        env: Registered env whose first-turn prompts are used.
        env_config: Keyword config of that env.
        protocol: Prompt settings; must match the later RL run's.
        budget: Turn budget shown in the prompt; must match the later RL run's.
        num_examples: Distinct prompts (one env seed each).
        answers_per_prompt: Random answers trained per prompt; several per
            prompt teach a spread-out choice instead of one arbitrary answer.
        epochs: Passes over the examples.
        batch_size: Examples per optimiser step.
        lr: AdamW learning rate.
        seed: Seeds the env instances, the random actions and the shuffling.
    """

    env: str = "bandit"
    env_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolConfig = ProtocolConfig()
    budget: TurnBudget = TurnBudget()
    num_examples: int = 256
    answers_per_prompt: int = 1
    epochs: int = 2
    batch_size: int = 8
    lr: float = 1e-4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_examples", "answers_per_prompt", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm start {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"warm start lr must be > 0, got {self.lr}")

    def fingerprint(self, model: str) -> str:
        """A short hash naming the cached result of warm-starting `model` with this config."""
        payload = json.dumps({"model": model, **dataclasses.asdict(self)}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def warm_start(
    model: str, config: WarmStartConfig, *, cache_dir: str | Path | None = None, progress: bool = False
) -> Path:
    """Returns the directory of `model` warm-started with `config` (built once, then cached)."""
    base_path = resolve_model(model, cache_dir=cache_dir, progress=progress)
    steps = config.epochs * -(-config.num_examples * config.answers_per_prompt // config.batch_size)
    builtin = BuiltinModel(
        name=f"warm-start-{config.fingerprint(str(base_path))}",
        description=f"{model} format-warm-started on {config.env}",
        source=f"{base_path} + format warm start {dataclasses.asdict(config)}",
        n_steps=steps,
        build=lambda out_dir, report: _train(base_path, config, out_dir, report),
    )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return prepare_builtin(builtin, models_dir=root / "models", progress=progress)


def format_examples(protocol: PromptProtocol, config: WarmStartConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) pairs: first-turn prompts, random well-formed answers."""
    env = make_env(config.env, **config.env_config)
    rng = np.random.default_rng(config.seed)
    template = protocol.template
    examples = []
    for index in range(config.num_examples):
        observation, _ = env.reset(seed=config.seed * 1_000_003 + index)
        prompt = protocol.system_ids + protocol.user_ids(
            observation, turns_left=config.budget.max_turns, actions_left=config.budget.max_actions_per_traj
        )
        for _ in range(config.answers_per_prompt):
            count = int(rng.integers(1, config.protocol.max_actions_per_turn + 1))
            actions = [env.random_action(rng) for _ in range(count)]
            answer = _answer_text(actions, think=config.protocol.think)
            response = template.encode(answer[len(config.protocol.prefill_text):]) + [template.eos_token_id]
            examples.append((prompt, response))
    return examples


def _answer_text(actions: list[str], *, think: bool) -> str:
    answer = f"<answer>{f' {ACTION_SEPARATOR} '.join(actions)}</answer>"
    return f"<think>I will try {', '.join(actions)}.</think>{answer}" if think else answer


def _train(base_path: Path, config: WarmStartConfig, out_dir: Path, report: Callable[[str], None]) -> None:
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(base_path)
    env = make_env(config.env, **config.env_config)
    protocol = PromptProtocol(
        ChatTemplate.from_tokenizer(tokenizer),
        instructions=env.instructions,
        action_vocabulary=env.action_vocabulary,
        config=config.protocol,
    )
    examples = format_examples(protocol, config)
    model = load_causal_lm(base_path).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    rng = np.random.default_rng(config.seed)
    for epoch in range(config.epochs):
        order = rng.permutation(len(examples))
        for start in range(0, len(order), config.batch_size):
            batch = [examples[i] for i in order[start : start + config.batch_size]]
            loss = response_nll(model, _collate(batch, pad_id=tokenizer.pad_token_id or 0))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            report(f"epoch {epoch + 1} loss {loss.item():.3f}")
    model.eval().save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def response_nll(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean negative log-likelihood of the response tokens (logits only where needed)."""
    hidden = trunk_hidden(model.base_model, batch)
    logp = score_generated_tokens(model.get_output_embeddings(), hidden, batch, 1.0, with_entropy=False)[TOKEN_LOGP]
    return -masked_mean(logp, batch[Columns.LOSS_MASK])


def _collate(batch: list[tuple[list[int], list[int]]], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded token rows whose loss mask marks the responses."""
    length = max(len(p) + len(r) for p, r in batch)
    input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(batch), length), dtype=torch.long)
    attention = torch.zeros((len(batch), length), dtype=torch.long)
    for row, (prompt, response) in enumerate(batch):
        ids = prompt + response
        input_ids[row, : len(ids)] = torch.tensor(ids)
        loss_mask[row, len(prompt) : len(ids)] = 1
        attention[row, : len(ids)] = 1
    return {INPUT_IDS: input_ids, ATTENTION_MASK: attention, Columns.LOSS_MASK: loss_mask}
