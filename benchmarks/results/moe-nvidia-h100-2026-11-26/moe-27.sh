#!/usr/bin/env bash
# Issue 27 on one H100 (main's code): the MoE GPU tests, the fused-experts kernel benchmark, and Qwen3-30B-A3B
# (dummy bf16) batch-1 decode beside its active-bytes floor and the nano-vllm offline workload.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py tests/test_gpu.py tests/test_hf_parity.py \
  -k "moe or mixtral" > $OUT/moe-gpu-tests.log 2>&1; echo "tests rc=$?"; tail -15 $OUT/moe-gpu-tests.log
timeout 120 python -m benchmarks.moe_kernel --out $OUT > $OUT/moe-kernel.log 2>&1; echo "kernel rc=$?"; tail -30 $OUT/moe-kernel.log
timeout 200 python -m infer_core.cli bench latency --model Qwen3-30B-A3B --peers floor --out $OUT > $OUT/moe-latency.log 2>&1
echo "latency rc=$?"; grep -vE "it/s\]|s/it\]" $OUT/moe-latency.log | tail -15
