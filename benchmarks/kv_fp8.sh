#!/usr/bin/env bash
# Issue 26 item 5 (FP8 KV cache) on one H100: the FP8 KV GPU tests, then the long-context workload
# (32 requests x 7,900-token prompts, 256 new tokens each, Qwen3-0.6B dummy, bf16): bf16 KV (triton),
# fp8 KV (triton) and bf16 KV with the engine's default backend; wall time and the logged KV capacity,
# JSON under $OUT. Run from the repository root after `source .device/setup.sh`; about 3 minutes.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/kv-fp8}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kv_fp8.py \
  plugins/attention_triton/tests/test_kv_fp8.py plugins/attention_triton/tests/test_kv_fused.py \
  > "$OUT/kv-fp8-gpu-tests.log" 2>&1
echo "kv fp8 gpu tests rc=$?"; grep -E "passed|failed|Error" "$OUT/kv-fp8-gpu-tests.log" | tail -12
timeout 300 python -m benchmarks.kv_fp8 --out "$OUT" > "$OUT/kv-fp8.log" 2>&1; echo "kv_fp8 rc=$?"
grep -vE "it/s\]|s/it\]|INFO" "$OUT/kv-fp8.log" | tail -8
