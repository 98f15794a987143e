"""Training only the top decoder layers of a causal LM: the rest of the model stays the base model's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def train_top_layers_only(policy: PreTrainedModel, top_layers: int) -> None:
    """Freezes all of a Hugging Face causal LM but its last `top_layers` decoder layers and final norm.

    The embeddings, and the LM head tied to them, stay the base model's, and
    backward stops at the first trained layer: the layers below run forward
    only and keep no activations for backward, and the frozen weights have no
    gradients and no optimiser state. A step costs about
    (1 + 2 x top_layers / layers) / 3 of a full fine-tuning step
    (docs/results/warm_start_speed.md). A model of `top_layers` layers or
    fewer trains every weight, embeddings included: a preset's setting for
    SmolLM2's 30 layers leaves a small test model whole. `top_layers` >= 1: the setting that gives it
    (`LLMModuleSettings`, `WarmStartSettings`) checks it.
    """
    layers = getattr(policy.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(policy).__name__} has no decoder `layers` list to train the top of")
    if top_layers >= len(layers):
        return
    policy.requires_grad_(False)
    layers[len(layers) - top_layers :].requires_grad_(True)
    norm = getattr(policy.get_decoder(), "norm", None)
    if isinstance(norm, nn.Module):
        norm.requires_grad_(True)
