# Issue 26 (session 2026-11-27f), call S1: gate_up's SiLU-and-mul in the W8 GEMV's epilogue (one launch fewer a layer
# at decode sizes). GPU tests of the plugin and the core's fusion seam, then Qwen3-8B batch-1 decode (bf16, int8,
# FP8) on the base tree (b116a07, in .wt/base) and on this tree, alternated.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 200 python -m pytest -q plugins/quant_w8a8/tests tests/fused/test_gemv_fusion.py -p no:cacheprovider -rfE \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu-tests.log
bench() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 150 python -m benchmarks.quant_decode --out $OUT/$1 > $OUT/$1.log 2>&1)
  echo "$1 rc=$? at ${SECONDS}s"; grep -E "tok/s" $OUT/$1.log
}
bench base-1 $HERE/.wt/base
bench new-1 $HERE
bench base-2 $HERE/.wt/base
bench new-2 $HERE
