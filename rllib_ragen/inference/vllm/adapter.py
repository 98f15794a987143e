"""The policy's LoRA adapter, served by a vLLM engine as a LoRA request (`EngineSettings.serves_adapter`).

vLLM loads an adapter only from a directory (`LoRARequest.lora_path`), so each engine
actor writes the adapter tensors it receives (either transport) into a PEFT adapter
directory of its own (`adapter_config.json` from the policy's `LoraConfig`,
`adapter_model.safetensors`) and loads it under one adapter id with
`load_inplace=True`, which replaces the adapter that id held. Generation and scoring
then name the adapter with a request *without* `load_inplace`: vLLM would otherwise
reload the directory at every step the request is scheduled in. Until the first
load no request is passed, and the engine serves the base model (which is what a
fresh adapter, B = 0, computes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    from vllm import LLM

from rllib_ragen.lora import LoraSettings

# vLLM's allowed `max_lora_rank` values (`vllm.config.lora.MaxLoRARanks`, vLLM 0.32). A copy, so that
# config validation need not import vLLM (seconds); tests/inference/test_weight_sync.py checks it against vLLM's.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_NAME, _ID = "policy", 1


def max_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds adapters of rank `rank`.

    Raises:
        ValueError: `rank` is larger than vLLM's largest (names the setting).
    """
    fitting = [allowed for allowed in VLLM_MAX_LORA_RANKS if allowed >= rank]
    if not fitting:
        raise ValueError(
            f"lora_rank={rank} is larger than vLLM's largest max_lora_rank ({VLLM_MAX_LORA_RANKS[-1]}): "
            "use a smaller rank or .inference(lora_sync='merged')"
        )
    return fitting[0]


def lora_engine_kwargs(settings: LoraSettings) -> dict[str, object]:
    """`vllm.LLM` keyword arguments of an engine that serves one adapter of `settings`' rank."""
    return {"enable_lora": True, "max_lora_rank": max_lora_rank(settings.rank), "max_loras": 1}


class ServedAdapter:
    """One engine's adapter directory, and the request that names the adapter loaded from it.

    Args:
        settings: The policy's LoRA settings (its `LoraConfig` is the directory's config).
    """

    def __init__(self, settings: LoraSettings) -> None:
        self.settings = settings
        # Removed with the actor's process (small: the adapter tensors only).
        self._directory = tempfile.TemporaryDirectory(prefix="rllib_ragen_lora_")
        self.request: Any = None  # a vllm LoRARequest once loaded

    def load(self, llm: LLM, weights: Sequence[tuple[str, Tensor]]) -> None:
        """Writes `weights` (PEFT-named adapter tensors) as the adapter and loads it in place of the last."""
        from peft.utils import SAFETENSORS_WEIGHTS_NAME
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        path = Path(self._directory.name)
        self.settings.peft_config().save_pretrained(str(path))
        # Own contiguous copies: received tensors may be views of one buffer, which safetensors refuses.
        save_file({name: tensor.contiguous().clone() for name, tensor in weights}, str(path / SAFETENSORS_WEIGHTS_NAME))
        llm.llm_engine.add_lora(LoRARequest(_NAME, _ID, str(path), load_inplace=True))
        self.request = LoRARequest(_NAME, _ID, str(path))
