"""TRL's side of `benchmarks/trl_peer.py`: GRPOTrainer on the peer work, each step timed.

Runs in TRL's own venv (`benchmarks/trl_venv.py`), started by `trl_peer.py --trl-side SPEC RESULT`.
The work comes in the spec the driver wrote: the prompts this project rendered for the Bandit's
first turn (text and token ids, one per seed), the model directory and the sampling. The reward
is this project's: each group of completions steps an `EnvGroup` of the env reset with the
prompt's seed, each answer parsed by the project's `PromptProtocol`, exactly as the env runner
does (the format penalty included).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Imported here for the reward and the step clock; this module is only ever imported in TRL's venv.
from transformers import TrainerCallback


class StepClock(TrainerCallback):  # type: ignore[misc]
    """Seconds of each optimiser step, end to end: from the previous step's end (the first: from the
    start of training) to this one's, so generation, reward, update and logging all count."""

    def __init__(self, label: str, steps: int, lengths: list[float]) -> None:
        self.label, self.steps, self.lengths = label, steps, lengths
        self.seconds: list[float] = []
        self.last = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self.last)
        self.last = now
        length = self.lengths[-1] if self.lengths else float("nan")
        print(
            f"[{self.label}] step {len(self.seconds)}/{self.steps}: {self.seconds[-1]:.1f} s, "
            f"mean completion {length:.1f} tokens",
            flush=True,
        )


def env_reward(spec: dict[str, Any], tokenizer: Any, lengths: list[float], rewards: list[float]) -> Callable:
    """TRL's reward function: the project's env reward of each parsed answer; it also records each
    step's mean completion length (tokens generated, the end-of-turn token included) and mean reward."""
    from rllib_ragen.data.demonstrations import group_and_protocol
    from rllib_ragen.rollout.env_group import EnvGroup, TurnBudgetSettings
    from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings

    budget = TurnBudgetSettings(**spec["budget"])
    _, protocol = group_and_protocol(
        tokenizer, spec["env"], spec["env_config"], ProtocolSettings(**spec["protocol"]), budget
    )
    size = spec["group_size"]
    group = EnvGroup(
        spec["env"], spec["env_config"], group_size=size, budget=budget, group_randomness=spec["group_randomness"]
    )

    def project_env_reward(completion_ids: list[list[int]], seed: list[int], **kwargs: Any) -> list[float]:
        out: list[float] = []
        for start in range(0, len(completion_ids), size):
            observations, _ = group.reset(seed=seed[start])
            actions = {
                agent: protocol.parse(ids)[1].actions
                for agent, ids in zip(observations, completion_ids[start : start + size])
            }
            step_rewards = group.step(actions)[1]
            out.extend(float(step_rewards[agent]) for agent in actions)
        lengths.append(statistics.fmean(len(ids) for ids in completion_ids))
        rewards.append(statistics.fmean(out))
        return out

    return project_env_reward


def grpo_config(spec: dict[str, Any], output_dir: str, *, use_vllm: bool) -> Any:
    """GRPOConfig for the work: one optimiser step a step on all its completions, no KL, bf16 autocast,
    no activation recomputation (as our learner)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=True,
        model_init_kwargs={"dtype": "float32"},  # float32 weights under bf16 autocast, as this project's learner
        per_device_train_batch_size=spec["completions"],
        gradient_accumulation_steps=1,
        num_generations=spec["group_size"],
        max_completion_length=spec["max_tokens"],
        temperature=spec["trl_temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        beta=0.0,
        num_iterations=1,
        # TRL's default recomputes activations in backward; this project's learner does not (nor needs to
        # for a 135M model), so both sides do the same work.
        gradient_checkpointing=False,
        max_steps=spec["steps"],
        shuffle_dataset=False,  # the prompts in seed order, as this project's seed cursor hands them out
        seed=spec["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_max_model_length=spec["max_model_len"],
        vllm_enable_sleep_mode=False,
    )


def run_trl_side(spec: dict[str, Any], *, use_vllm: bool) -> dict[str, Any]:
    """Trains `spec["steps"]` GRPOTrainer steps and returns each step's seconds, mean completion length
    and mean reward, with the versions and whether TRL's tokenisation of the prompts gave this project's ids."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    rows = spec["prompts"]
    # TRL tokenises a plain-text prompt as `tokenizer(text)`; the check says whether it saw our exact tokens.
    same_ids = all(tokenizer(row["text"])["input_ids"] == row["ids"] for row in rows)
    lengths: list[float] = []
    rewards: list[float] = []
    label = "TRL vllm" if use_vllm else "TRL generate"
    clock = StepClock(label, spec["steps"], lengths)
    with tempfile.TemporaryDirectory(prefix="trl-peer-") as output_dir:
        trainer = trl.GRPOTrainer(
            model=spec["model"],
            reward_funcs=env_reward(spec, tokenizer, lengths, rewards),
            args=grpo_config(spec, output_dir, use_vllm=use_vllm),
            train_dataset=Dataset.from_list([{"prompt": row["text"], "seed": row["seed"]} for row in rows]),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer.train()
    return {
        "side": label,
        "seconds": clock.seconds,
        "completion_tokens": lengths,
        "rewards": rewards,
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "prompt_ids_match": same_ids,
    }


def trl_side_main(spec_path: Path, result_path: Path) -> None:
    """The worker: runs the spec's TRL side and writes its figures, or the error that stopped it, as JSON."""
    spec = json.loads(spec_path.read_text())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec["vllm_kv_cache_gb"]))
    try:
        result = run_trl_side(spec, use_vllm=spec["use_vllm"])
    except Exception as error:
        result_path.write_text(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        raise
    result_path.write_text(json.dumps(result))
