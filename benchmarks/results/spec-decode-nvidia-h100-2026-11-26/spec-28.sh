#!/usr/bin/env bash
# Issue 28 on one H100 (main after the spec merge): its GPU tests and the CUDA-graph tests, then batch-1 decode of
# main beside the tree before the merge (.wt/base), alternated, and the verify step's cost with n-gram drafts.
set -u
cd "$(dirname "$0")/.."
B=$PWD/.wt/base; BASE_PP=$PYTHONPATH
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_graphs.py tests/test_overlap.py plugins/spec_decode/tests \
  > $OUT/spec-gpu-tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^E " $OUT/spec-gpu-tests.log | tail -12
BP="$B:$B/plugins/attention_triton/src:$B/plugins/attention_flash/src:$B/plugins/parallel_tp/src:$BASE_PP"
for r in 1 2; do
  for t in base main; do
    if [ $t = base ]; then pp=$BP; else pp=$BASE_PP; fi
    PYTHONPATH=$pp timeout 90 python -m infer_core.cli bench latency --repeats 3 > $OUT/lat-$t-$r.log 2>&1
    echo "$t $r: $(grep -E '^--- infer' $OUT/lat-$t-$r.log | head -1)"
  done
done
