#!/usr/bin/env bash
# Issue 27 on one H200 (`nvidia-h200`): 8-bit experts (INFER_QUANTIZATION=int8 / fp8 on Qwen3-30B-A3B, dummy
# weights). The GPU tests of the 8-bit grouped GEMMs and decode GEMVs, then weight memory and batch-1 decode of
# none / int8 / fp8 (benchmarks.quant_decode), then the nano-vllm offline workload in bf16 and fp8, one after the
# other in one call. From the repo root after `source .device/setup.sh`; JSON and logs under $OUT/q27.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p $OUT/q27
timeout 240 python -m pytest -q -p no:cacheprovider plugins/quant_w8a8/tests/test_experts.py tests/fused/test_moe_gpu.py \
  -rfE > $OUT/q27/gpu-tests.log 2>&1
echo "gpu tests rc=$?: $(tail -1 $OUT/q27/gpu-tests.log)"
timeout 300 python -m benchmarks.quant_decode --model Qwen3-30B-A3B --out $OUT/q27 > $OUT/q27/decode.log 2>&1
echo "quant_decode rc=$?"; grep -E "tok/s" $OUT/q27/decode.log | tail -3
run() {  # name, then env assignments
  local name=$1; shift
  env "$@" timeout 300 infer bench throughput --model Qwen3-30B-A3B --load-format dummy --workload nano-vllm \
    --out $OUT/q27/$name > $OUT/q27/$name.log 2>&1
  echo "$name rc=$?: $(grep -E '^infer ' $OUT/q27/$name.log | tail -2 | tr -s ' ')"
}
run bf16
run fp8 INFER_QUANTIZATION=fp8
