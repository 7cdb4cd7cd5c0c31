#!/usr/bin/env bash
# Issue 28 (session 2026-11-27e), call R1: overlapped scheduling with n-gram drafts. GPU tests of the speculative
# path, overlap and CUDA graphs; Qwen3-0.6B batch-1 plain decode (the path every step takes) against the tree
# before (35e9a9d, in .wt/base), alternated.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu plugins/spec_decode/tests tests/test_overlap.py \
  tests/test_speculative_path.py tests/test_cuda_graphs_gpu.py tests/test_piecewise_graphs_gpu.py -rfE \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -5 $OUT/gpu-tests.log
lat() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 90 python -m infer_core.cli bench latency --model Qwen3-0.6B \
     --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$?"; grep -E "^infer " $OUT/$1.log
}
lat lat-base-1 $HERE/.wt/base
lat lat-new-1 $HERE
lat lat-base-2 $HERE/.wt/base
lat lat-new-2 $HERE
