#!/usr/bin/env bash
# `make demo`: the full local stack (control plane, GPU node agent, operator, gateway, a SmolLM2
# pool on the CPU vLLM engine, tenant "demo") and seed 000's OpenAI-SDK example against it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
STATE=.devcluster
if ! "$BIN/llmbatch" dev status --state-dir "$STATE" >/dev/null 2>&1; then
  "$BIN/llmbatch" dev up --state-dir "$STATE"
fi
# shellcheck disable=SC1091
source "$STATE/demo.env"
work=.cache/demo/run-$(date +%Y%m%d-%H%M%S)
mkdir -p "$work"
echo "== seed 000 example against $OPENAI_BASE_URL (files in $work)"
(cd "$work" && IDEMPOTENCY_KEY="demo-$(basename "$work")" POLL_SECONDS=5 \
  "../../../$BIN/python" ../../../examples/seed000_client.py)
cat <<MSG

The stack is still running:
  source $STATE/demo.env                 # OPENAI_BASE_URL, OPENAI_API_KEY, KUBECONFIG for the SDK
  .cache/bin/kubectl get batches -A      # the Batch objects the gateway created
  .venv/bin/llmbatch dev down            # stop everything
MSG
