"""StarPO as an RLlib Algorithm: `starpo` (StarPOConfig, StarPO.training_step) and the modules its steps call
(`sampling/`, `diagnostics`, `update`), its checks (`validation`), the Hugging Face export (`export`), its settings
groups, presets and offline training."""
