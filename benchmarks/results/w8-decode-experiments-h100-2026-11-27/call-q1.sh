# Issue 26 (session 2026-11-27d), call Q1: the core's fused RMSNorm -> GEMV (-> SiLU-and-mul) launch on W8A8 layers
# (8-bit weights, a scale a row). GPU tests, then Qwen3-8B batch-1 decode (bf16, int8, FP8) on the base tree
# (8e9a856, in .wt/base) and on this tree, alternated.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 120 python -m pytest -q tests/fused/test_norm_gemv.py tests/fused/test_norm_gemv_gpu.py plugins/quant_w8a8/tests/test_fusion.py \
  plugins/quant_w8a8/tests/test_gemv.py -p no:cacheprovider -rfE > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu-tests.log
bench() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 150 python -m benchmarks.quant_decode --out $OUT/$1 > $OUT/$1.log 2>&1)
  echo "$1 rc=$?"; grep -E "tok/s" $OUT/$1.log
}
bench base-1 $HERE/.wt/base
bench new-1 $HERE
bench base-2 $HERE/.wt/base
bench new-2 $HERE
