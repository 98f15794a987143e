#!/usr/bin/env bash
# Smoke test of the GPU preset on a machine with one GPU (about 10 minutes):
# trains `ragen_preset` for 2 iterations, checks every weight sync end to end
# (the engines' log-probs against the learner's), prints the weight-sync time,
# tokens/s and one iteration's breakdown, then checkpoints, resumes for one more
# iteration and exports. Exits non-zero on any failure (2: no GPU visible).
#
#   bash scripts/gpu_smoke.sh                  # one GPU, Qwen2.5-0.5B-Instruct (needs a hub or a local copy)
#   bash scripts/gpu_smoke.sh --model DIR      # a local Hugging Face model directory instead
#   bash scripts/gpu_smoke.sh --cpu-tiny       # no GPU: the same steps on CPU with the tiny random model
#
# Further flags: python -m rllib_ragen.run.gpu_smoke --help. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
exec "$PYTHON" -m rllib_ragen.run.gpu_smoke "$@"
