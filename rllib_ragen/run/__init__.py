"""Running experiments: driver, evaluation CLI, MLflow tracking and callbacks, sweeps, checkpoints, run pages."""
