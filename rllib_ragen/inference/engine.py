"""The inference-engine contract: token ids in, sampled token ids and log-probs out.

Every rollout engine (the in-process HF engine, the pool of vLLM actors)
implements `InferenceEngine`. Prompts and completions are token ids, never text:
the tokens the learner trains on are exactly the tokens the engine sampled.
The token-id batches every engine takes are validated and left-padded here too,
and so are the HF-named policy weights an engine loads: checked against the
model's shapes, and packed for Ray's object store zero-copy (torch tensors go
through it by pickling, a copy on `put` and on every `get`; numpy arrays do not):
`pack_weights` turns a state dict into numpy arrays (bfloat16, which numpy lacks,
as a same-width integer view: never through float32) and `unpack_weights` turns
them back into torch views of the original dtype without copying.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import ray
import torch
from torch import Tensor

from rllib_ragen.inference.collective import GroupSpec, TensorLayout, receive
from rllib_ragen.lora import LoraSettings, adapter_state_dict, add_adapters

# numpy has no bfloat16: such tensors travel as raw integers of the same width.
_RAW_VIEWS = {torch.bfloat16: torch.int16}


def check_weights(state_dict: Mapping[str, Tensor], expected_shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Checks that every weight names a parameter of the model, with its shape.

    A subset of the model's weights is fine (a partial update).

    Raises:
        KeyError: a name is not one of the model's (lists a few unknown and expected names).
        ValueError: a shape differs from the model's, or `state_dict` is empty.
    """
    if not state_dict:
        raise ValueError("update_weights got an empty state dict")
    unknown = sorted(set(state_dict) - set(expected_shapes))
    if unknown:
        raise KeyError(
            f"{len(unknown)} weight name(s) are not parameters of the engine's model, e.g. {unknown[:3]}; "
            f"expected HF names such as {sorted(expected_shapes)[:3]}"
        )
    wrong = [
        f"{name}: got {tuple(value.shape)}, expected {expected_shapes[name]}"
        for name, value in state_dict.items()
        if tuple(value.shape) != tuple(expected_shapes[name])
    ]
    if wrong:
        raise ValueError(f"{len(wrong)} weight(s) have the wrong shape: " + "; ".join(wrong[:3]))


def hf_weight_shapes(model_path: str | Path, lora: LoraSettings | None = None) -> dict[str, tuple[int, ...]]:
    """The HF state-dict names and shapes of the model in `model_path`, without loading weights;
    with `lora`, those of its LoRA adapter's tensors (`adapter_state_dict`) instead."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        state = model.state_dict() if lora is None else adapter_state_dict(add_adapters(model, lora))
    return {name: tuple(value.shape) for name, value in state.items()}


@dataclasses.dataclass(frozen=True)
class PackedWeights:
    """A state dict as numpy arrays, for a zero-copy trip through Ray's object store.

    Attributes:
        names: HF parameter names.
        arrays: One contiguous array per name (integer views for bfloat16).
        dtypes: The torch dtype name of each tensor ("bfloat16", "float32", ...).
    """

    names: tuple[str, ...]
    arrays: tuple[np.ndarray, ...]
    dtypes: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.arrays)


def unique_weights(state_dict: Mapping[str, Tensor]) -> list[tuple[str, Tensor]]:
    """(name, tensor) pairs of `state_dict` with every tensor once, in their own dtype and device.

    Tensors that are one tensor under two names (tied embeddings: `state_dict()`
    lists `lm_head.weight` and `model.embed_tokens.weight`) are kept once, under
    the first name; the engines' loaders refresh the tied head from it.
    """
    pairs = []
    seen: set[tuple] = set()
    for name, tensor in state_dict.items():
        tensor = torch.as_tensor(tensor).detach()
        identity = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and identity in seen:
            continue
        seen.add(identity)
        pairs.append((name, tensor))
    return pairs


def pack_weights(state_dict: Mapping[str, Tensor]) -> PackedWeights:
    """Packs a state dict (tensors on any device) into numpy arrays on the host (see `unique_weights`)."""
    names, arrays, dtypes = [], [], []
    for name, tensor in unique_weights(state_dict):
        tensor = tensor.to("cpu").contiguous()
        dtypes.append(str(tensor.dtype).removeprefix("torch."))
        raw = _RAW_VIEWS.get(tensor.dtype)
        arrays.append((tensor.view(raw) if raw is not None else tensor).numpy())
        names.append(name)
    return PackedWeights(tuple(names), tuple(arrays), tuple(dtypes))


def unpack_weights(packed: PackedWeights) -> list[tuple[str, Tensor]]:
    """(name, tensor) pairs viewing `packed`'s arrays, without copying.

    Arrays fetched from Ray's object store are read-only; the tensors are only
    ever read (copied into the engine's parameters), so torch's warning about
    non-writable arrays is silenced.
    """
    pairs = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, array, dtype in zip(packed.names, packed.arrays, packed.dtypes):
            tensor = torch.from_numpy(array)
            pairs.append((name, tensor.view(getattr(torch, dtype))))
    return pairs


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
        cached_prompt_tokens: The prompt's leading tokens the engine took from its
            prefix cache instead of computing them (0 for an engine without one).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    cached_prompt_tokens: int = 0


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
