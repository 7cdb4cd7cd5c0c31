#!/usr/bin/env bash
# Issue 26 on one H100 (branch quant2): the W8A8 plugin's GPU tests (the FP8 GEMM's bias in _scaled_mm's
# epilogue and the bounds from their arithmetic; the W8 GEMV with PDL and the dense GEMV's bytes a K step at
# large K), then Qwen3-8B batch-1 decode and weight memory of bf16, int8 and FP8 in one process (the ratios to
# bf16 are this call's own). From the repo root after `source .device/setup.sh`; JSON and logs under $OUT.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu plugins/quant_w8a8/tests > $OUT/quant-gpu-tests.log 2>&1
echo "quant tests rc=$?"; grep -E "passed|failed|Error" $OUT/quant-gpu-tests.log | tail -12
timeout 300 python -m benchmarks.quant_decode --out $OUT > $OUT/quant-decode.log 2>&1; echo "quant_decode rc=$?"
grep -vE "it/s\]|s/it\]|INFO" $OUT/quant-decode.log | tail -14
