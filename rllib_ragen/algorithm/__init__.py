"""StarPO as an RLlib Algorithm: `starpo` (StarPOConfig, StarPO.training_step), its settings groups and presets."""
