"""Column names of the learner's [rows, L] token batch, beside RLlib's `Columns`.

Each mask has one name, the same in the row layout [R, L] (this batch) and in
the trajectory layout [B, T] (`TokenBatch.trajectories`, advantage estimation);
the container tells the layout:
- `GENERATED_MASK`: the tokens the model generated, which the module scores;
- `Columns.LOSS_MASK` (RLlib's meaning, what enters the loss): M_loss, the
  generated tokens in the policy, entropy and KL terms;
- `ADVANTAGE_MASK`: M_adv, the generated tokens with values and advantages,
  hence value targets.
`Columns.ADVANTAGES`, `Columns.VF_PREDS` (old values) and `Columns.VALUE_TARGETS`
keep RLlib's meaning. `Columns.ACTION_LOGP` is not used in the batch: in episodes
it holds the engine's sampling log-probs, which the batch carries as
`SAMPLING_LOGP`; the learner's own old log-probs are `OLD_LOGP`.
"""

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
GENERATED_MASK = "generated_mask"
ADVANTAGE_MASK = "advantage_mask"
# The engine's log-probs of the sampled tokens (an episode's `Columns.ACTION_LOGP`).
SAMPLING_LOGP = "sampling_logp"
# The learner's log-probs of the same tokens before the update (the PPO ratio's denominator).
OLD_LOGP = "old_logp"
# `forward_train` outputs, [rows, L]: per-token log-probs and entropies of the generated tokens.
TOKEN_LOGP = "token_logp"
TOKEN_ENTROPY = "token_entropy"
