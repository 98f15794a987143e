"""`LLMRLModule`: a Hugging Face causal LM as an RLlib RLModule (policy + critic).

Batches are right-padded token rows:
- `input_ids`      [B, L] long
- `attention_mask` [B, L] 0/1
- `generated_mask` [B, L] 0/1, 1 on tokens the model generated (`GENERATED_MASK`)

Per-token outputs are aligned with `input_ids`: entry t is about generating
token t (its log-prob under the policy, the entropy of that next-token
distribution, the critic's value of the prefix before it), and 0 where
`generated_mask` is 0. Logits are only computed at generated positions, so a long
prompt never materialises a [B, L, vocab] tensor, and only `logit_chunk_size`
positions at a time: under autograd each chunk's logits are recomputed in
backward rather than kept (`ScoringSettings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint
import tree
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from rllib_ragen.columns import ATTENTION_MASK, GENERATED_MASK, INPUT_IDS, TOKEN_ENTROPY, TOKEN_LOGP
from rllib_ragen.logits import logprobs_and_entropies
from rllib_ragen.lora import (
    LoraSettings,
    adapter_state_dict,
    add_adapters,
    merged_state_dict,
    shared_trunk_copy,
)
from rllib_ragen.models import load_causal_lm, resolve_model
from rllib_ragen.training.advantages import critic_free_estimators
from rllib_ragen.training.token_tree import TokenTree, token_tree, tree_hidden, use_tree_attention, worth_a_tree
from rllib_ragen.training.top_layers import train_top_layers_only

CRITIC_KINDS = ("none", "head", "separate")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTOCAST_DTYPES = ("bfloat16", "float16")
# Generated positions whose [chunk, vocab] logits exist at once (`ScoringSettings.logit_chunk_size`).
LOGIT_CHUNK_SIZE = 1024


@dataclasses.dataclass(frozen=True)
class LLMModuleSettings:
    """The model `LLMRLModule` builds (`StarPOConfig.llm()`, which documents each field).

    `model` is a built-in name, a local model directory or a hub id; `critic` is "separate",
    "head" or "none"; `dtype` the trained parameters'; `trained_top_layers` None trains every
    weight of the policy, N only its last N decoder layers and final norm.
    """

    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    critic: str = "separate"
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    trained_top_layers: int | None = None

    def __post_init__(self) -> None:
        if self.trained_top_layers is not None and self.trained_top_layers < 1:
            raise ValueError(f"trained_top_layers must be >= 1 or None, got {self.trained_top_layers}")
        if self.critic not in CRITIC_KINDS:
            raise ValueError(f"critic must be one of {CRITIC_KINDS}, got {self.critic!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")


def module_config(
    llm_module: LLMModuleSettings, *, lora: LoraSettings | None = None, logit_temperature: float = 1.0
) -> dict[str, Any]:
    """The `model_config` of an `LLMRLModule`'s spec: its settings groups themselves, and the temperature
    its log-probs divide the logits by (the rollouts', so tokens are scored under the distribution they
    were sampled from). `lora` None: no adapters (every weight trains)."""
    return {"llm_module": llm_module, "lora": lora or LoraSettings(), "logit_temperature": logit_temperature}


@dataclasses.dataclass(frozen=True)
class ScoringSettings:
    """How `forward_train` computes log-probs, entropies and values (set by the learner).

    Each field is documented where `StarPOConfig.training()` sets it.
    """

    autocast_dtype: str | None = None
    autocast_lm_head: bool = False
    logit_chunk_size: int = LOGIT_CHUNK_SIZE

    def __post_init__(self) -> None:
        if self.autocast_lm_head and self.autocast_dtype is None:
            raise ValueError("autocast_lm_head needs an autocast_dtype (the dtype the LM head would run in)")
        if self.autocast_dtype is not None and self.autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast_dtype must be None or one of {AUTOCAST_DTYPES}, got {self.autocast_dtype!r}")
        if self.logit_chunk_size < 1:
            raise ValueError(f"logit_chunk_size must be >= 1, got {self.logit_chunk_size}")

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The autocast context for tensors on `device` (a no-op when autocast_dtype is None)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=_DTYPES[self.autocast_dtype])


class LLMRLModule(TorchRLModule, ValueFunctionAPI, InferenceOnlyAPI):
    """Policy = the causal LM; critic = value head or separate trunk + head."""

    @override(TorchRLModule)
    def setup(self) -> None:
        settings = self.model_config or {}
        self.llm_config: LLMModuleSettings = settings["llm_module"]
        self.lora: LoraSettings = settings["lora"]
        self.logit_temperature: float = settings["logit_temperature"]
        dtype = _DTYPES[self.llm_config.dtype]
        model_path = resolve_model(self.llm_config.model)
        self.scoring = ScoringSettings()
        self.policy = load_causal_lm(model_path, dtype=dtype)
        use_tree_attention(self.policy)
        lora = self.lora
        if self.llm_config.critic == "separate" and not self.inference_only:
            # Under LoRA one frozen trunk serves both: the critic's adapters wrap the policy's base tensors.
            # The causal LM's base model, a PreTrainedModel (transformers types `base_model` nn.Module).
            self.critic_trunk: Any = (
                add_adapters(shared_trunk_copy(self.policy.base_model), lora)
                if lora.enabled
                else load_causal_lm(model_path, dtype=dtype).base_model
            )
            use_tree_attention(self.critic_trunk)
        if lora.enabled:
            add_adapters(self.policy, lora)
        if self.llm_config.trained_top_layers is not None:
            train_top_layers_only(self.policy, self.llm_config.trained_top_layers)
        if self.llm_config.gradient_checkpointing:
            # Non-reentrant: it also passes gradients to adapters when the frozen embeddings' outputs need none.
            kwargs: dict[str, Any] = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
            self.policy.gradient_checkpointing_enable(**kwargs)
            if hasattr(self, "critic_trunk"):
                self.critic_trunk.gradient_checkpointing_enable(**kwargs)
        if self.inference_only or self.llm_config.critic == "none":
            return
        hidden = self.policy.config.hidden_size
        # Zero init: the critic starts at V = 0 instead of random noise.
        self.value_head = nn.Linear(hidden, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def has_critic(self) -> bool:
        return hasattr(self, "value_head")

    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self) -> list[str]:
        return ["value_head", "critic_trunk"]

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.score(batch, with_logp=True, with_entropy=True, with_values=self.has_critic)

    def score(self, batch: dict[str, Any], *, with_logp: bool, with_entropy: bool, with_values: bool) -> dict[str, Any]:
        """Per-token log-probs, entropies and critic values of the generated tokens, [B, L] each.

        Each part is computed only when asked for: the learner connector's
        scoring pass needs no entropy, and no log-probs when the update is one
        on-policy step (the old log-probs then equal the new ones).
        """
        out: dict[str, Any] = {}
        with self.scoring.autocast(self.policy.device):
            hidden = None
            if with_logp or with_entropy or (with_values and self.llm_config.critic == "head"):
                hidden = trunk_hidden(self.policy.base_model, batch)
            if with_logp or with_entropy:
                out = self.score_with(self.policy, batch, hidden=hidden, with_entropy=with_entropy)
            if with_values:
                out[Columns.VF_PREDS] = self.compute_values(batch, embeddings=hidden)
        return out

    def score_with(
        self, policy: PreTrainedModel, batch: dict[str, Any], *, hidden: torch.Tensor | None = None, with_entropy: bool
    ) -> dict[str, torch.Tensor]:
        """Log-probs (and entropies) of the generated tokens under `policy` (this module's, or a frozen
        reference), scored like this module's: same temperature, chunking and autocast."""
        if hidden is None:
            with self.scoring.autocast(policy.device):
                hidden = trunk_hidden(policy.base_model, batch)
        return score_generated_tokens(
            policy.get_output_embeddings(),
            hidden,
            batch,
            self.logit_temperature,
            with_entropy=with_entropy,
            chunk_size=self.scoring.logit_chunk_size,
            head_autocast=self.scoring.autocast_lm_head,
        )

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """Critic values per token, [B, L], aligned like the log-probs.

        `embeddings` (the policy trunk's hidden states) is reused by the
        value-head critic, detached so the critic cannot drag the policy; a
        separate critic runs its own trunk.
        """
        if not self.has_critic:
            raise ValueError(f"this module has no critic (critic='none'); use one of {critic_free_estimators()}")
        if self.llm_config.critic == "separate":
            hidden = trunk_hidden(self.critic_trunk, batch)
        else:
            hidden = embeddings if embeddings is not None else trunk_hidden(self.policy.base_model, batch)
            hidden = hidden.detach()
        predicting = _select_predicting(hidden, batch[GENERATED_MASK])
        values = self.value_head(predicting).squeeze(-1).float()
        return _scatter(values, batch[GENERATED_MASK])

    def policy_state_dict(self, *, adapter: bool = False) -> dict[str, torch.Tensor]:
        """The policy's weights for engines: Hugging Face parameter names, LoRA adapters merged in; with
        `adapter`, the LoRA adapter's tensors alone (PEFT's names), for engines that serve it."""
        if adapter:
            return adapter_state_dict(self.policy)
        return merged_state_dict(self.policy) if self.lora.enabled else self.policy.state_dict()

    @override(TorchRLModule)
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> dict:
        """A snapshot of the module's tensors on the host, each in its own dtype.

        RLlib's version converts them to numpy, which has no bfloat16 (a bf16
        module crashed there) and turns float16 into float32. Torch tensors keep
        the dtype through checkpoints and Ray's object store; `set_state` takes
        them (and older numpy states) as they are. With `inference_only`, the
        critic is left out. Under LoRA only the trained tensors (adapters, value
        head) are in it: the frozen base is the model directory's.
        """
        skipped = set(self.get_non_inference_attributes()) if inference_only and not self.inference_only else set()
        state = self.state_dict()
        if self.lora.enabled:
            trained = {name for name, param in self.named_parameters(remove_duplicate=False) if param.requires_grad}
            state = {k: v for k, v in state.items() if k in trained}
        return host_copy({k: v for k, v in state.items() if k.split(".", 1)[0] not in skipped})

    @override(TorchRLModule)
    def set_state(self, state: dict) -> None:
        """RLlib's `set_state`; under LoRA it also refuses a state that lacks trained tensors or holds unknown
        ones (e.g. a full fine-tuning checkpoint, whose weights would otherwise be silently dropped)."""
        if self.lora.enabled and not self.inference_only:
            trained = {name for name, param in self.named_parameters(remove_duplicate=False) if param.requires_grad}
            known = set(self.state_dict())
            missing, unknown = sorted(trained - set(state)), sorted(set(state) - known)
            if missing or unknown:
                raise ValueError(
                    f"this LoRA module's state does not match: {len(missing)} trained tensors missing "
                    f"(e.g. {missing[:2]}), {len(unknown)} unknown (e.g. {unknown[:2]}); was it saved with the "
                    "same lora_rank, lora_target_modules and critic?"
                )
        super().set_state(state)


def host_copy(structure: Any) -> Any:
    """`structure` with every tensor copied to the host in its own dtype; other leaves as they are.

    What RLlib's `convert_to_numpy` is for in states, without its dtype changes
    (numpy has no bfloat16; it also casts float16 to float32).
    """
    return tree.map_structure(
        lambda leaf: leaf.detach().to("cpu", copy=True) if isinstance(leaf, torch.Tensor) else leaf, structure
    )


def trunk_hidden(trunk: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Last hidden states of a transformer trunk, [B, L, H]: the rows as one token tree, each position
    they share run once (`rllib_ragen.training.token_tree`), where that pays; else row by row."""
    tree = tree_plan(trunk, batch)
    if tree is not None:
        return tree_hidden(trunk, tree)
    return trunk(input_ids=batch[INPUT_IDS], attention_mask=batch[ATTENTION_MASK]).last_hidden_state


def tree_plan(trunk: nn.Module, batch: dict[str, Any]) -> TokenTree | None:
    """The token tree `trunk_hidden` runs rows [R, L] as, or None when it runs them row by row."""
    tree = token_tree(batch[INPUT_IDS], batch[ATTENTION_MASK])
    return tree if worth_a_tree(trunk, tree, int(batch[ATTENTION_MASK].sum())) else None


def computed_positions(trunk: nn.Module, batch: dict[str, Any]) -> int:
    """Token positions `trunk_hidden` runs the trunk on for rows [R, L] (what its FLOPs count)."""
    tree = tree_plan(trunk, batch)
    return tree.num_nodes if tree is not None else int(batch[INPUT_IDS].numel())


def score_generated_tokens(
    lm_head: nn.Module,
    hidden: torch.Tensor,
    batch: dict[str, Any],
    temperature: float,
    *,
    with_entropy: bool = True,
    chunk_size: int = LOGIT_CHUNK_SIZE,
    head_autocast: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-prob (and entropy) of every generated token, [B, L] each.

    Logits are computed only at the N positions that predict a generated
    token, `chunk_size` positions at a time, in float32 outside any autocast
    (with `head_autocast`, under the caller's autocast; the log-softmax stays float32).
    When autograd records and there is more than one chunk, each chunk is
    checkpointed: backward recomputes its [chunk, vocab] logits, so they are
    never all alive at once. A single chunk is kept: its backward needs those
    logits alive once either way, so recomputing them would cost a pass over
    the vocabulary and save no peak memory.
    """
    generated_mask = batch[GENERATED_MASK]
    predicting = _select_predicting(hidden, generated_mask)
    labels = batch[INPUT_IDS][:, 1:][generated_mask[:, 1:].bool()]
    recording = torch.is_grad_enabled() and (predicting.requires_grad or lm_head.weight.requires_grad)
    recompute = recording and predicting.shape[0] > chunk_size
    logps, entropies = [], []
    for start in range(0, predicting.shape[0], chunk_size):
        args = (lm_head, predicting[start : start + chunk_size], labels[start : start + chunk_size], temperature)
        if recompute:
            logp, entropy = torch.utils.checkpoint.checkpoint(
                _score_chunk, *args, with_entropy=with_entropy, head_autocast=head_autocast, use_reentrant=False
            )
        else:
            logp, entropy = _score_chunk(*args, with_entropy=with_entropy, head_autocast=head_autocast)
        logps.append(logp)
        entropies.append(entropy)
    out = {TOKEN_LOGP: _scatter(_cat(logps, hidden.device), generated_mask)}
    if with_entropy:
        out[TOKEN_ENTROPY] = _scatter(_cat(entropies, hidden.device), generated_mask)
    return out


def _score_chunk(
    lm_head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool,
    head_autocast: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 log-probs of `labels` [n] and entropies [n] from hidden states [n, H].

    The LM head runs outside autocast, in the parameter dtype, unless
    `head_autocast` (then under the caller's autocast, if any); the log-softmax
    always in float32. Without `with_entropy` the entropies are an empty placeholder.
    """
    outside = contextlib.nullcontext() if head_autocast else torch.autocast(hidden.device.type, enabled=False)
    with outside:
        weight = lm_head.weight
        assert isinstance(weight, torch.Tensor), f"the LM head has no weight tensor: {lm_head}"
        logits = lm_head(hidden if head_autocast else hidden.to(weight.dtype))
    logp, entropy = logprobs_and_entropies(logits, labels, temperature)
    return logp, entropy if with_entropy else entropy.new_empty(0)


def _cat(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenates per-chunk values [n_i] -> [N] (an empty float tensor when there are no chunks)."""
    return torch.cat(parts) if parts else torch.zeros(0, device=device)


def _select_predicting(hidden: torch.Tensor, generated_mask: torch.Tensor) -> torch.Tensor:
    """Hidden states that predict a generated token: [B, L, H] -> [N, H].

    The state at position t-1 predicts token t, so position t-1 is selected
    when token t is generated (N = number of generated tokens after position 0).
    """
    return hidden[:, :-1][generated_mask[:, 1:].bool()]


def _scatter(values: torch.Tensor, generated_mask: torch.Tensor) -> torch.Tensor:
    """Puts per-generated-token values [N] back on the token grid [B, L] (0 elsewhere)."""
    out = torch.zeros(generated_mask.shape, dtype=values.dtype, device=values.device)
    out[:, 1:][generated_mask[:, 1:].bool()] = values
    return out
