"""LoRA adapters (PEFT) on the policy and the separate critic's trunk.

Adapters are injected into the Hugging Face model in place
(`peft.inject_adapter_in_model`), so the policy stays a `PreTrainedModel` with
its usual `base_model`, `get_output_embeddings` and forward: every scoring path
of `LLMRLModule` runs unchanged. PEFT freezes the base weights; only the
adapters (and the value head) are trained, checkpointed and put in the optimiser.
Engines get merged weights under the plain HF names (`merged_state_dict`), so
every weight-sync transport and engine loads them as it loads a full-fine-tuned
policy, or (`EngineSettings.serves_adapter`) the adapter tensors alone
(`adapter_state_dict`), which a vLLM engine serves as a LoRA request.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

# PEFT's name for the one adapter of a model; it appears in every adapter tensor's name.
ADAPTER = "default"
_BASE_LAYER = ".base_layer."
_ADAPTER_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.")


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """LoRA of the trained model (PEFT's `LoraConfig` fields; `StarPOConfig.llm()` sets them as `lora_<name>`).

    Each field is documented where `StarPOConfig.llm()` sets it (as `lora_<field>`).
    """

    rank: int = 0
    alpha: float = 16.0
    target_modules: str | tuple[str, ...] = "all-linear"
    dropout: float = 0.0
    top_layers: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"lora_rank must be an int >= 0 (0 = full fine-tuning), got {self.rank!r}")
        if self.alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.alpha}")
        if not isinstance(self.top_layers, int) or self.top_layers < 0:
            raise ValueError(f"lora_top_layers must be an int >= 0 (0 = every layer), got {self.top_layers!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in _as_tuple(self.target_modules)):
            raise ValueError(
                f"lora_target_modules must be 'all-linear' or non-empty module names, got {self.target_modules!r}"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def peft_config(self, model: nn.Module | None = None) -> LoraConfig:
        """PEFT's config for `model` (needed when `top_layers` > 0; an adapter directory served by an
        engine needs none: its tensors' names say which layers they adapt)."""
        target = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        layers: dict[str, Any] = {}
        if self.top_layers and model is not None:
            num_layers = cast(Any, model).config.num_hidden_layers  # an HF model: nn.Module types no .config
            if self.top_layers > num_layers:
                raise ValueError(f"lora_top_layers={self.top_layers} but the model has {num_layers} layers")
            # PEFT takes `layers_to_transform` with module names only, not with "all-linear".
            target = _linear_module_names(model) if target == "all-linear" else target
            layers = {
                "layers_to_transform": list(range(num_layers - self.top_layers, num_layers)),
                "layers_pattern": "layers",
            }
        # PEFT annotates lora_alpha int, but scales by lora_alpha / r and accepts any number.
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]
            target_modules=target,
            lora_dropout=self.dropout,
            **layers,
        )


def _linear_module_names(model: nn.Module) -> list[str]:
    """The names (last part) of `model`'s linear layers but its output head: what "all-linear" adapts."""
    head = cast(Any, model).get_output_embeddings()  # an HF model: nn.Module types no get_output_embeddings
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and module is not head
        }
    )


def _as_tuple(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def add_adapters(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """Injects fresh LoRA adapters into `model` in place (B = 0: the model's function is unchanged) and
    freezes every other weight. Returns `model`.

    Raises:
        ValueError: (PEFT's) no module of `model` matches `settings.target_modules`.
    """
    inject_adapter_in_model(settings.peft_config(model), model, adapter_name=ADAPTER)
    return model


def shared_trunk_copy(trunk: nn.Module) -> nn.Module:
    """A second `trunk` whose parameters ARE the original's (same tensors, no copy).

    Module objects are copied, parameters are not: adapters injected into the
    copy wrap its own linear layers around the shared, frozen base weights.
    Sound only while those weights are frozen, as under LoRA.
    """
    return copy.deepcopy(trunk, memo={id(param): param for param in trunk.parameters()})


def is_adapter_weight(name: str) -> bool:
    """True for the name of a LoRA adapter tensor (in a state dict of a model with injected adapters)."""
    return any(part in name for part in _ADAPTER_PARTS)


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """`model`'s weights with the adapters folded in, under the plain HF names; `model` is not changed.

    W' = W + (alpha / r) B @ A per adapted layer (PEFT's `get_delta_weight`),
    in W's dtype. Unadapted tensors are the model's own (tied ones stay one tensor).
    """
    # PEFT defines get_delta_weight on each LoraLayer subclass (Linear, Embedding, ...), not on the base.
    deltas = {
        name: module.get_delta_weight(ADAPTER)  # type: ignore[attr-defined]
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }
    merged = {}
    for name, tensor in model.state_dict().items():
        if is_adapter_weight(name):
            continue
        layer, base, leaf = name.rpartition(_BASE_LAYER)
        if base:
            name = f"{layer}.{leaf}"
            if leaf == "weight":
                tensor = tensor + deltas[layer].to(tensor.dtype)
        merged[name] = tensor
    return merged


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapter tensors of `model` (with injected adapters) under PEFT's saved names (the adapter
    name dropped), as an adapter directory's `adapter_model.safetensors` holds them; `model`'s own tensors.

    The base embeddings are never included: they are frozen, and the engines hold them already.
    """
    return get_peft_model_state_dict(model, adapter_name=ADAPTER, save_embedding_layers=False)


def load_adapters(model: nn.Module, adapters: Mapping[str, Tensor]) -> None:
    """Loads saved adapter tensors (names as in `model.state_dict()`) into `model`'s injected adapters.

    Raises:
        KeyError: a name is not an adapter of `model`, or one of `model`'s adapters is missing.
    """
    expected = {name for name in model.state_dict() if is_adapter_weight(name)}
    unknown, missing = sorted(set(adapters) - expected), sorted(expected - set(adapters))
    if unknown or missing:
        raise KeyError(
            f"adapter weights do not match the model's LoRA layers: {len(unknown)} unknown (e.g. {unknown[:2]}), "
            f"{len(missing)} missing (e.g. {missing[:2]}); were they saved with the same lora_rank and "
            "lora_target_modules?"
        )
    model.load_state_dict(dict(adapters), strict=False)


def peft_model_with_adapters(model: nn.Module, adapters: Mapping[str, Tensor], settings: LoraSettings) -> PeftModel:
    """`model` (a freshly loaded base) as a PEFT model holding the saved `adapters` (see `load_adapters`),
    for `save_pretrained` (an adapter directory) or `merge_and_unload` (a plain model)."""
    peft_model = get_peft_model(model, settings.peft_config(model), adapter_name=ADAPTER)
    load_adapters(model, adapters)
    return peft_model
