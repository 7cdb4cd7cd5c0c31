#!/usr/bin/env bash
# One H100 call: batch-1 decode of main before this session's merges (fac2aaf, .wt/base) and now, then issue 28's
# draft-model GPU tests and benchmark. From the repo root after `source .device/setup.sh`.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
root=$PWD
for i in 1 2; do
  for side in base now; do
    dir=$root; [ $side = base ] && dir=$root/.wt/base
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH timeout 100 python -m infer_core.cli bench latency --repeats 3 --out $OUT/latency-$side-$i > $OUT/latency-$side-$i.log 2>&1)
    echo "$side $i rc=$?: $(grep -E 'ms/token|ms a token|tok/s' $OUT/latency-$side-$i.log | tail -2 | tr '\n' ' ')"
  done
done
OUT=$OUT/spec bash benchmarks/spec_draft.sh
