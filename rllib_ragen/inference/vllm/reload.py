"""In-place weight reload inside a vLLM worker, tied LM head included.

Runs in vLLM's worker process through `LLM.collective_rpc(reload_in_worker, ...)`.

The tied-head trap (vLLM 0.32): with `tie_word_embeddings`, vLLM's
`lm_head` shares its parameter with `embed_tokens`, but on the CPU backend the
head computes logits from a *repacked copy* of that weight made at load time
(`UnquantizedEmbeddingMethod.process_weights_after_loading` ->
`dispatch_cpu_unquantized_gemm`). vLLM's `reload_weights` repacks a layer only
when that layer itself receives a weight; a state dict without `lm_head.weight`
(e.g. `dict(model.named_parameters())`, which lists a tied tensor once) updates
the embedding but leaves the head computing logits from the old weights, silently.
`repack_tied_embeddings` rebuilds the kernels of every module that shares its
weight with another one, whatever names the caller sent.

On every reload vLLM's layerwise loader warns "Failed to load weights" for each
layer the update names no weight of. Two such layers are expected in every
sync: the tied head (no weight of its own in a Hugging Face state dict;
repacked here) and the rotary embedding (a cache computed from the config, not
a checkpoint weight). `ExpectedUnloadedLayers` drops just those two warnings;
any other layer left unloaded still warns.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

# vLLM's layerwise reload module logs under its module name (`vllm.logger.init_logger(__name__)`).
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
EXPECTED_UNLOADED_LAYERS = frozenset({"ParallelLMHead", "RotaryEmbedding"})


class ExpectedUnloadedLayers(logging.Filter):
    """Drops the layerwise loader's "Failed to load weights" warning for `EXPECTED_UNLOADED_LAYERS` only."""

    def filter(self, record: logging.LogRecord) -> bool:
        unloaded = record.msg == "%s: Failed to load weights" and bool(record.args)
        return not (unloaded and isinstance(record.args, tuple) and record.args[0] in EXPECTED_UNLOADED_LAYERS)


def quiet_expected_unloaded_layers() -> None:
    """Installs `ExpectedUnloadedLayers` on vLLM's layerwise logger (once per process)."""
    layerwise = logging.getLogger(LAYERWISE_LOGGER)
    if not any(isinstance(f, ExpectedUnloadedLayers) for f in layerwise.filters):
        layerwise.addFilter(ExpectedUnloadedLayers())


def reload_in_worker(worker: Any, weights: Sequence[tuple[str, Tensor]]) -> list[str]:
    """Loads HF-named `weights` into the worker's model in place; repacks tied heads.

    Args:
        worker: The vLLM worker (`collective_rpc` passes it first).
        weights: (HF name, tensor) pairs; a subset of the model's weights is fine.

    Returns:
        Names of the modules whose tied weights were repacked.
    """
    quiet_expected_unloaded_layers()
    worker.model_runner.reload_weights(weights_iterator=weights)
    return repack_tied_embeddings(worker.model_runner.get_model())


def repack_tied_embeddings(model: nn.Module) -> list[str]:
    """Re-runs the unquantized embedding post-load step on modules sharing a weight.

    Only unquantized embeddings/heads are touched: re-processing them is
    idempotent (a quantized layer's post-load step is not, and is left alone).
    On GPU the step is a no-op, so this costs nothing there.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )

    sharing: dict[int, list[tuple[str, nn.Module]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        weight = getattr(module, "weight", None)
        unquantized = isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod)
        if isinstance(weight, torch.Tensor) and unquantized:
            sharing.setdefault(id(weight), []).append((name, module))
    repacked = []
    for modules in sharing.values():
        if len(modules) > 1:
            for name, module in modules:
                cast(Any, module).quant_method.process_weights_after_loading(module)  # a vLLM layer, no nn.Module attr
                repacked.append(name)
    return repacked
