"""Export of the trained policy as a plain Hugging Face model directory (or a PEFT adapter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup

from rllib_ragen.lora import LoraSettings, peft_model_with_adapters
from rllib_ragen.models import load_causal_lm, load_tokenizer, resolve_model
from rllib_ragen.rollout.env_runner import policy_weights
from rllib_ragen.training.module import LLMModuleSettings


def export_policy(
    learner_group: LearnerGroup,
    llm_module: LLMModuleSettings,
    lora: LoraSettings,
    directory: str | Path,
    *,
    adapter: bool = False,
) -> Path:
    """Writes the learners' policy as a plain Hugging Face model directory (LoRA adapters merged in).

    Args:
        learner_group: The algorithm's `LearnerGroup`.
        llm_module: The model the policy was built on (`.llm()`).
        lora: Its LoRA settings (`.llm()`).
        directory: Where to write it (created when missing).
        adapter: Under LoRA, write a PEFT adapter directory instead
            (`adapter_config.json` naming the base model directory,
            `adapter_model.safetensors`), loadable with `peft.PeftModel.from_pretrained`.
    """
    if adapter and not lora.enabled:
        raise ValueError("export_policy(adapter=True) needs a LoRA policy (.llm(lora_rank=r > 0))")
    component = f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}"
    state = learner_group.get_state(components=component, inference_only=True)
    module_state = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
    return save_policy(
        module_state,
        base_model=llm_module.model,
        dtype=llm_module.dtype,
        directory=directory,
        lora=lora,
        adapter=adapter,
    )


def save_policy(
    module_state: dict[str, Any],
    *,
    base_model: str,
    dtype: str,
    directory: str | Path,
    lora: LoraSettings | None = None,
    adapter: bool = False,
) -> Path:
    """Writes the policy of an `LLMRLModule` state (critic dropped) as a plain Hugging Face
    model directory, with the tokenizer of `base_model`, the model the module was built on.
    A LoRA state (`lora` with rank > 0) is merged into the base, or with `adapter` written as a
    PEFT adapter directory."""
    model_path = resolve_model(base_model)
    policy = load_causal_lm(model_path, dtype=getattr(torch, dtype))
    to_save: Any = policy
    if lora is not None and lora.enabled:
        peft_policy = peft_model_with_adapters(policy, policy_weights(module_state), lora)
        to_save = peft_policy if adapter else peft_policy.merge_and_unload()
    else:
        policy.load_state_dict(policy_weights(module_state))
    directory = Path(directory)
    to_save.save_pretrained(directory, safe_serialization=True)
    load_tokenizer(model_path).save_pretrained(directory)
    return directory
