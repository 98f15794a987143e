"""`HFEngine`: the in-process fallback engine, a Hugging Face causal LM with a KV cache, and its
next-token sampling math.

It decodes token-id prompts in left-padded sub-batches and reports the same
log-probabilities as the vLLM pool: the tokens and log-probs a learner trains on
come from one place whichever engine is used. The sampling follows vLLM's sampler
with `logprobs_mode="processed_logprobs"`: the reported log-prob of a token is
taken under the distribution it was drawn from, i.e. after temperature and the
top-p cut. Greedy decoding (temperature 0) reports plain `log_softmax(logits)` and
ignores top-p, as vLLM does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rllib_ragen.inference.engine import (
    Completion,
    InferenceEngine,
    SamplingParams,
    check_score_inputs,
    check_token_ids,
    check_weights,
    left_pad,
)
from rllib_ragen.logits import token_logprobs

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


def mask_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keeps the smallest set of tokens whose probability mass reaches `top_p`.

    The rest get -inf. The most likely token always survives. Same rule as
    vLLM: a token is dropped when the cumulative mass of the tokens *less*
    likely than or as likely as it is <= 1 - top_p.

    Args:
        logits: [B, V] float logits (already temperature-scaled).
        top_p: Nucleus mass in (0, 1]; 1 returns `logits` unchanged.

    Returns:
        [B, V] logits with the dropped tokens at -inf.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1.0 - top_p
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def processed_logprobs(logits: Tensor, *, temperature: float, top_p: float = 1.0) -> Tensor:
    """Log-probabilities of the distribution a token is sampled from.

    Args:
        logits: [B, V] raw next-token logits (any float dtype).
        temperature: Softmax temperature; 0 means greedy (reported at temperature 1).
        top_p: Nucleus mass; ignored when greedy.

    Returns:
        [B, V] float32 log-probabilities (-inf outside the nucleus).
    """
    logits = logits.float()
    if temperature == 0:
        return logits.log_softmax(dim=-1)
    return mask_top_p(logits / temperature, top_p).log_softmax(dim=-1)


def choose_tokens(logprobs: Tensor, *, greedy: bool, generator: torch.Generator | None = None) -> Tensor:
    """Picks one token per row: the argmax, or a draw from `exp(logprobs)`.

    Args:
        logprobs: [B, V] log-probabilities (from `processed_logprobs`).
        greedy: Take the argmax instead of sampling.
        generator: Random source for sampling (None = torch's global one).

    Returns:
        [B] int64 token ids.
    """
    if greedy:
        return logprobs.argmax(dim=-1)
    return draw_by_inverse_cdf(logprobs.exp(), generator=generator)


def draw_by_inverse_cdf(probs: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row from `probs`: a single uniform number per row, located in the row's cumulative sum.

    The same distribution as `torch.multinomial(probs, 1)`, faster on CPU
    (`benchmarks/token_sampling.py`): multinomial spends its time on
    per-element random numbers. The sum runs in float64, so
    rare tokens keep their mass, and the right-sided search never returns a token
    of zero probability.

    Args:
        probs: [B, V] non-negative weights, each row with positive mass (need not sum to 1).
        generator: Random source (None = torch's global one), on `probs`'s device.

    Returns:
        [B] int64 token ids.
    """
    cumulative = probs.double().cumsum(dim=-1)
    uniform = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)
    chosen = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True).squeeze(-1)
    past_end = chosen == probs.shape[-1]
    if past_end.any():  # the product rounded up to the row's total: the last token with mass is the draw
        has_mass = probs[past_end] > 0
        chosen[past_end] = probs.shape[-1] - 1 - has_mass.flip(-1).int().argmax(dim=-1)
    return chosen


logger = logging.getLogger(__name__)


class HFEngine(InferenceEngine):
    """Batched generation with a HF causal LM held in this process.

    Args:
        model: A local model directory, or an already-built causal LM (used as is,
            e.g. shared with a learner on the same device).
        dtype: Weight dtype when loading from a directory.
        max_batch_size: Prompts decoded together; bounds the KV cache and logits memory.
        num_threads: Sets `torch.set_num_threads` for this process (None = leave it).
        pad_token_id: Token used for left padding (default: the model config's pad,
            else its eos). Padding is masked, so its value never changes the output.
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        *,
        dtype: torch.dtype = torch.float32,
        max_batch_size: int = 32,
        num_threads: int | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if num_threads is not None:
            if num_threads < 1:
                raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
            torch.set_num_threads(num_threads)
        if isinstance(model, (str, Path)):
            from rllib_ragen.models import load_causal_lm

            model = load_causal_lm(model, dtype=dtype)
        self.model = model.eval()
        self.max_batch_size = max_batch_size
        self.pad_token_id = _pad_token_id(self.model.config) if pad_token_id is None else pad_token_id
        self.vocab_size: int = self.model.get_input_embeddings().num_embeddings
        self.max_length: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self.last_sync_seconds: float | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Returns one completion per prompt, in the order of `prompts`.

        Prompts are decoded longest-first in sub-batches of `max_batch_size` (less
        padding); with `params.seed` set, one generator seeded once drives the call.
        """
        if not prompts:
            return []
        self._check_lengths(prompts, extra_tokens=params.max_new_tokens)
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: dict[int, Completion] = {}
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            for index, completion in zip(chunk, self._generate_batch([prompts[i] for i in chunk], params, generator)):
                results[index] = completion
        return [results[i] for i in range(len(prompts))]

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs (temperature 1) of each continuation's tokens after its prompt."""
        joined = check_score_inputs(prompts, continuations, vocab_size=self.vocab_size)
        if not prompts:
            return []
        self._check_lengths(joined, extra_tokens=0)
        scores = []
        for start in range(0, len(prompts), self.max_batch_size):
            stop = start + self.max_batch_size
            scores.extend(self._score_batch(prompts[start:stop], continuations[start:stop]))
        return scores

    def update_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Copies `state_dict` (HF names, a subset is fine) into the model in place."""
        start = time.perf_counter()
        own = self.model.state_dict()
        check_weights(state_dict, {name: tuple(value.shape) for name, value in own.items()})
        with torch.no_grad():
            for name, value in state_dict.items():
                own[name].copy_(torch.as_tensor(value))
        self.last_sync_seconds = time.perf_counter() - start
        logger.info("HFEngine: loaded %d weights in %.3f s", len(state_dict), self.last_sync_seconds)

    def health(self) -> dict[str, object]:
        return {
            "engine": type(self).__name__,
            "healthy": True,
            "device": str(self.device),
            "dtype": str(next(self.model.parameters()).dtype),
            "last_sync_seconds": self.last_sync_seconds,
        }

    def shutdown(self) -> None:
        """Drops the model (the engine is unusable afterwards)."""
        del self.model

    @torch.no_grad()
    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, generator: torch.Generator | None
    ) -> list[Completion]:
        """Decodes one sub-batch; a row leaves the batch (and its KV cache) once it stops."""
        input_ids, mask = left_pad(prompts, pad_token_id=self.pad_token_id)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        cache, logits = out.past_key_values, out.logits[:, -1]
        rows = torch.arange(len(prompts))  # the prompt index of each live batch row
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long)
        for step in range(params.max_new_tokens):
            step_logprobs = processed_logprobs(logits.cpu(), temperature=params.temperature, top_p=params.top_p)
            chosen = choose_tokens(step_logprobs, greedy=params.temperature == 0, generator=generator)
            picked = step_logprobs.gather(-1, chosen[:, None]).squeeze(-1)
            for row, token, logprob in zip(rows.tolist(), chosen.tolist(), picked.tolist()):
                tokens[row].append(token)
                logprobs[row].append(logprob)
            live = ~torch.isin(chosen, stop_ids)
            if step == params.max_new_tokens - 1 or not live.any():
                break
            if not live.all():
                keep = live.nonzero().squeeze(-1)
                cache.batch_select_indices(keep.to(self.device))
                rows, chosen = rows[keep], chosen[keep]
                mask, positions = mask[keep.to(self.device)], positions[keep.to(self.device)]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=chosen[:, None].to(self.device),
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
        stops = set(params.stop_token_ids)
        return [Completion(t, lp, "stop" if t[-1] in stops else "length") for t, lp in zip(tokens, logprobs)]

    @torch.no_grad()
    def _score_batch(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        sequences = [list(p) + list(c) for p, c in zip(prompts, continuations)]
        input_ids, mask = left_pad(sequences, pad_token_id=self.pad_token_id)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        device = self.device
        logits = self.model(
            input_ids=input_ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device)
        ).logits
        # Position t predicts token t + 1; labels past the end are dummies, sliced off below.
        labels = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1).to(device)
        logp = token_logprobs(logits, labels).cpu()
        width = input_ids.shape[1]
        return [logp[row, width - 1 - len(c) : width - 1].tolist() for row, c in enumerate(continuations)]

    def _check_lengths(self, sequences: Sequence[Sequence[int]], *, extra_tokens: int) -> None:
        check_token_ids(sequences, vocab_size=self.vocab_size, what="prompt")
        longest = max(len(s) for s in sequences) + extra_tokens
        if self.max_length is not None and longest > self.max_length:
            raise ValueError(
                f"a sequence needs {longest} positions (prompt + new tokens), more than the model's {self.max_length}"
            )


def _pad_token_id(config: PretrainedConfig) -> int:
    for candidate in (getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    raise ValueError("the model config has neither pad_token_id nor eos_token_id; pass pad_token_id=")
