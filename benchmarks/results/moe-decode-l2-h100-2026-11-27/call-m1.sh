# Issue 27 (session 2026-11-27f), call M1: the decode-size MoE gate_up launch as persistent programs that load their
# next work item's tiles while summing the current one's (one K step a work item; 2 programs an SM). The sweep of
# programs an SM; the MoE kernel benchmark, the tree before (b116a07, .wt/before) and this one; MoE GPU tests;
# Qwen3-30B-A3B batch-1 decode, before and this tree.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 90 python -m benchmarks.moe_gemv_sweep --tokens 1,2 --out $OUT/sweep > $OUT/sweep.log 2>&1; echo "sweep rc=$?"
grep -E "^T=" $OUT/sweep.log
kernel() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 70 python -m benchmarks.moe_kernel --tokens 1,2,4,16 \
     --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$?"; grep -E "^qwen3" $OUT/$1.log
}
kernel kernel-before $HERE/.wt/before
kernel kernel-new $HERE
timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py tests/test_hf_parity.py \
  -k "moe or mixtral or gemv" -rfE > $OUT/moe-gpu-tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/moe-gpu-tests.log
lat() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 110 python -m infer_core.cli bench latency --model Qwen3-30B-A3B \
     --peers floor --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^(infer|floor) " $OUT/$1.log
}
lat lat-before $HERE/.wt/before
lat lat-new $HERE
