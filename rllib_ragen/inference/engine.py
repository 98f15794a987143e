"""The inference-engine contract: token ids in, sampled token ids and log-probs out.

Every rollout engine (the in-process HF engine, the pool of vLLM actors)
implements `InferenceEngine`. Prompts and completions are token ids, never text:
the tokens the learner trains on are exactly the tokens the engine sampled.
The token-id batches every engine takes are validated and left-padded here too.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

import ray
import torch
from torch import Tensor

from rllib_ragen.inference.collective import GroupSpec, TensorLayout, receive
from rllib_ragen.inference.weights import PackedWeights, unpack_weights


def check_token_ids(sequences: Sequence[Sequence[int]], *, vocab_size: int, what: str = "prompt") -> None:
    """Raises ValueError naming the first empty sequence or out-of-vocabulary token id."""
    for index, sequence in enumerate(sequences):
        if len(sequence) == 0:
            raise ValueError(f"{what} {index} is empty")
        if min(sequence) < 0 or max(sequence) >= vocab_size:
            raise ValueError(f"{what} {index} has token ids outside [0, {vocab_size})")


def check_score_inputs(
    prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, vocab_size: int
) -> list[list[int]]:
    """Validates `score` arguments; returns each prompt + continuation as one sequence."""
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    check_token_ids(continuations, vocab_size=vocab_size, what="continuation")
    return [list(p) + list(c) for p, c in zip(prompts, continuations)]


def left_pad(sequences: Sequence[Sequence[int]], *, pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Left-pads token-id sequences to one length.

    Returns:
        input_ids [B, L] int64 and attention_mask [B, L] int64 (0 on padding),
        L = the longest sequence.
    """
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            input_ids[row, width - len(sequence) :] = torch.as_tensor(sequence, dtype=torch.long)
            mask[row, width - len(sequence) :] = 1
    return input_ids, mask


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of completions.

    Args:
        max_new_tokens: Most tokens generated per prompt.
        temperature: Softmax temperature; 0 means greedy.
        top_p: Nucleus-sampling mass (1.0 = off).
        stop_token_ids: Token ids that end a completion (included in the output).
        seed: Seed of the sampler for this call, or None for fresh randomness.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclasses.dataclass
class Completion:
    """One sampled completion.

    Attributes:
        token_ids: The sampled token ids, stop token included when one was hit.
        logprobs: Per sampled token, its log-probability under the distribution
            it was sampled from (after temperature), same length as token_ids.
        finish_reason: "stop" (a stop token was sampled) or "length".
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class EngineTimeoutError(TimeoutError):
    """An engine did not finish a step (start, generate, score, a weight sync) within its configured time."""


class InferenceEngine(abc.ABC):
    """Generates completions for batches of token-id prompts."""

    #: The model lives in this process (the weight sync may then copy tensors into it directly).
    in_process: bool = True
    #: Brings an out-of-process engine's replaced actors up to date (set by the weight sync where it can).
    resync: Callable[[], object] | None = None
    #: Dead engine processes replaced so far (an in-process engine has none to replace).
    restarts: int = 0

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Returns one completion per prompt, in the order of `prompts`."""

    @abc.abstractmethod
    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs (temperature 1) of each continuation's tokens after its prompt.

        The engine-side half of an end-to-end weight-sync check: after
        `update_weights`, these must match the learner's own forward pass.
        """

    @abc.abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Loads new policy weights in place (HF parameter names)."""

    # The two transports of `rllib_ragen.inference.weight_sync`. These defaults suit an
    # engine that holds its model in this process; the vLLM pool forwards to its actors.
    def load_packed(self, packed: PackedWeights | ray.ObjectRef) -> None:
        """Loads weights packed for Ray's object store (`pack_weights`), or a reference to them."""
        if isinstance(packed, ray.ObjectRef):
            packed = ray.get(packed)
        self.update_weights(dict(unpack_weights(packed)))

    def start_receive(self, spec: GroupSpec, first_rank: int, layout: TensorLayout) -> Callable[[], None]:
        """Joins a weight broadcast as ranks `first_rank` .. `first_rank + receivers - 1`.

        Returns a function that waits until the received weights are loaded. This
        default receives in the caller's thread before returning, so the sender
        (rank 0) must be another process.
        """
        self.update_weights(dict(receive(spec, first_rank, layout)))
        return lambda: None

    def weight_receivers(self) -> tuple[int, int]:
        """(processes that join a weight broadcast, a number that changes whenever one is replaced).

        A new number makes the next broadcast form a new group, which a new process must join.
        """
        return 1, os.getpid()

    def score_each(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[list[float]]:
        """`score` of one continuation on every model copy this engine holds (one list per copy)."""
        return self.score([prompt], [continuation])

    def health(self) -> dict[str, object]:
        """A small status report (engine kind, live workers...)."""
        return {"engine": type(self).__name__, "healthy": True}

    def shutdown(self) -> None:  # noqa: B027 (a no-op default: an engine holding no resources need not override it)
        """Frees the engine's resources."""
