#!/usr/bin/env bash
# Issue 26 item 5 (FP8 KV: GPU tests and the long-context workload) and issue 29's GPU tests on one H100, then
# batch-1 decode of main before the merges (fac2aaf, .wt/base, its own plugins first on the path) and now.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
root=$PWD
OUT=$OUT/kv bash benchmarks/kv_fp8.sh
timeout 100 python -m pytest -q -p no:cacheprovider tests/test_structured_gpu.py tests/fused/test_token_bitmask.py \
  tests/sampling/test_bitmask.py > $OUT/structured-gpu-tests.log 2>&1
echo "structured GPU tests rc=$?"; grep -E "passed|failed|^FAILED|^E " $OUT/structured-gpu-tests.log | tail -8
base=$root/.wt/base
for side in base now; do
  dir=$root; pp=$PYTHONPATH
  [ $side = base ] && dir=$base && pp=$base:$base/plugins/attention_triton/src:$base/plugins/attention_flash/src:$base/plugins/parallel_tp/src:$base/plugins/parallel_ep/src:$base/plugins/quant_w8a8/src:$base/plugins/spec_decode/src:$PYTHONPATH
  (cd $dir && PYTHONPATH=$pp timeout 90 python -m infer_core.cli bench latency --repeats 3 --out $OUT/lat-$side > $OUT/lat-$side.log 2>&1)
  echo "$side rc=$?: $(grep -E '^--- infer' $OUT/lat-$side.log | head -1)"
done
