"""HF-named policy weights: validation, and a zero-copy form for Ray's object store.

Torch tensors go through Ray's object store by pickling (a copy on `put`, a copy
on every `get`), numpy arrays zero-copy. `pack_weights` turns a state dict into numpy arrays (bfloat16, which numpy
lacks, as a same-width integer view: never through float32) and `unpack_weights`
turns them back into torch views of the original dtype without copying.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

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
