#!/usr/bin/env bash
# Issue 28, draft-model speculative decoding, on one H100 (run from the repo root after `source .device/setup.sh`):
# the spec_decode plugin's GPU tests, then benchmarks/spec_draft.py: Qwen3-8B target + Qwen3-0.6B-shaped draft (dummy
# weights), batch 1: verify-step cost for k = 1..8 (and the runner path each k took: verify graph or eager), draft-proposal cost, end-to-end rate against plain decoding, and
# the speed-up those costs imply at acceptance 0.5 / 0.7 / 0.9. Everything lands under $OUT (about 3 minutes).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/spec-draft}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu plugins/spec_decode/tests > "$OUT/spec-draft-gpu-tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E " "$OUT/spec-draft-gpu-tests.log" | tail -12
timeout 240 python -m benchmarks.spec_draft --out "$OUT" > "$OUT/spec-draft.log" 2>&1
echo "bench rc=$?"; grep -vE "it/s\]|^\s*$" "$OUT/spec-draft.log" | tail -14
