#!/usr/bin/env bash
# Issue 26 on one H100 (main): the W8A8 plugin's GPU tests and Qwen3-8B batch-1 decode bf16/int8/fp8; then
# the dense batch-1 decode of main beside a747be2 (before this session's merges), alternated.
set -u
cd "$(dirname "$0")/.."
M=$PWD; B=$PWD/.wt/base; BASE_PP=$PYTHONPATH
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu plugins/quant_w8a8/tests > $OUT/quant-gpu-tests.log 2>&1
echo "quant tests rc=$?"; grep -E "passed|failed|Error" $OUT/quant-gpu-tests.log | tail -12
timeout 240 python -m benchmarks.quant_decode --out $OUT > $OUT/quant-decode.log 2>&1; echo "quant_decode rc=$?"
grep -vE "it/s\]|s/it\]|INFO" $OUT/quant-decode.log | tail -14
BP="$B:$B/plugins/attention_triton/src:$B/plugins/attention_flash/src:$B/plugins/parallel_tp/src:$BASE_PP"
for r in 1 2; do
  for t in base main; do
    if [ $t = base ]; then pp=$BP; else pp=$BASE_PP; fi
    PYTHONPATH=$pp timeout 90 python -m infer_core.cli bench latency --repeats 3 --out $OUT/lat-$t-$r > $OUT/lat-$t-$r.log 2>&1
    echo "$t $r: $(grep -E '^--- infer' $OUT/lat-$t-$r.log | head -1)"
  done
done
