"""Keys an `LLMEnvRunner` episode carries beyond RLlib's, read back by the learner and the data tools.

Per step, in `extra_model_outputs`: `USER_IDS` (the user turn's token ids before
the response), `CLOSE_IDS` (the template tokens closing it) and RLlib's
`Columns.ACTION_LOGP` (the engine's sampling log-probs); in the step info:
`RESPONSE_TEXT`. In the reset info:
`SYSTEM_IDS` (the system prompt's ids) and `GROUP_ID`; `POLICY_VERSION` tags the
weights that sampled the episode (async rollouts).
"""

USER_IDS = "user_ids"
CLOSE_IDS = "close_ids"
SYSTEM_IDS = "system_ids"
GROUP_ID = "group_id"
RESPONSE_TEXT = "response_text"
POLICY_VERSION = "policy_version"
