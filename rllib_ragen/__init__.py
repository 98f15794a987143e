"""rllib-ragen: StarPO (RAGEN's multi-turn agent RL) on Ray RLlib's new API stack."""

__version__ = "0.1.0"
