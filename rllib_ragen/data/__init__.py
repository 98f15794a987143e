"""Trajectory data: token-level histories <-> Arrow rows <-> RLlib episodes.

- `schema`: the Arrow schema of a stored trajectory, field by field.
- `convert`: group episodes <-> rows (pure, with row/field validation).
- `parquet`: write rollouts; read a Parquet dataset back as episodes with Ray Data.
- `demonstrations`: Sokoban solver traces played through the rollout prompt protocol.

Offline training from such a dataset lives in `rllib_ragen.algorithm.offline_training`.
"""
