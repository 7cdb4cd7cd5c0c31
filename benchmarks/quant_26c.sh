#!/usr/bin/env bash
# Issue 26 on one H100: Qwen3-8B offline throughput (the nano-vllm workload, dummy weights) in bf16, FP8 W8A8,
# and FP8 W8A8 with an FP8 KV cache, one after the other in one call (the ratios to bf16 are this call's own).
# The engine settings come from the environment (INFER_QUANTIZATION, INFER_KV_CACHE_DTYPE); each record's
# folder says which. From the repo root after `source .device/setup.sh`; JSON and logs under $OUT/q26.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p $OUT/q26
run() {  # name, then env assignments
  local name=$1; shift
  env "$@" timeout 240 infer bench throughput --model Qwen3-8B --load-format dummy --workload nano-vllm \
    --out $OUT/q26/$name > $OUT/q26/$name.log 2>&1
  echo "$name rc=$?: $(grep -E '^infer ' $OUT/q26/$name.log | tail -2 | tr -s ' ')"
}
run bf16
run fp8 INFER_QUANTIZATION=fp8
run fp8-kvfp8 INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
run bf16-again
