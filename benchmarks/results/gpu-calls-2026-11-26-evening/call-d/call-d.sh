#!/usr/bin/env bash
# Batch-1 decode now and before the merges (alternated), then issue 26's W8A8 GPU tests and Qwen3-8B decode.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
root=$PWD; base=$root/.wt/base
for side in now base; do
  dir=$root; pp=$PYTHONPATH
  [ $side = base ] && dir=$base && pp=$base:$base/plugins/attention_triton/src:$base/plugins/attention_flash/src:$base/plugins/parallel_tp/src:$base/plugins/parallel_ep/src:$base/plugins/quant_w8a8/src:$base/plugins/spec_decode/src:$PYTHONPATH
  (cd $dir && PYTHONPATH=$pp timeout 90 python -m infer_core.cli bench latency --repeats 3 --out $OUT/lat-$side > $OUT/lat-$side.log 2>&1)
  echo "$side rc=$?: $(grep -E '^--- infer:' $OUT/lat-$side.log | head -1)"
done
sed -i 's/timeout 240 python -m pytest/timeout 150 python -m pytest/; s/timeout 300 python -m benchmarks.quant_decode/timeout 250 python -m benchmarks.quant_decode/' benchmarks/quant_26b.sh
OUT=$OUT bash benchmarks/quant_26b.sh
