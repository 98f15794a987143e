"""Column names of the learner's [rows, L] token batch, beside RLlib's `Columns`.

`Columns.LOSS_MASK` marks the generated tokens, `Columns.ADVANTAGES`,
`Columns.VF_PREDS` (old values) and `Columns.VALUE_TARGETS` keep RLlib's meaning.
`Columns.ACTION_LOGP` is not used in the batch: in episodes it holds the engine's
sampling log-probs, which the batch carries as `SAMPLING_LOGP`; the learner's own
old log-probs are `OLD_LOGP`.
"""

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
# The engine's log-probs of the sampled tokens (an episode's `Columns.ACTION_LOGP`).
SAMPLING_LOGP = "sampling_logp"
# The learner's log-probs of the same tokens before the update (the PPO ratio's denominator).
OLD_LOGP = "old_logp"
# 0/1 masks inside `Columns.LOSS_MASK` (the generated tokens, which the module scores):
POLICY_MASK = "policy_mask"  # M_loss: tokens in the policy, entropy and KL terms
VALUE_MASK = "value_mask"  # M_adv: tokens with values, hence value targets
# `forward_train` outputs, [rows, L]: per-token log-probs and entropies of the generated tokens.
TOKEN_LOGP = "token_logp"
TOKEN_ENTROPY = "token_entropy"
