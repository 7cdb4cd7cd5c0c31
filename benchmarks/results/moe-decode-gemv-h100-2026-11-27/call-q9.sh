# Issue 27 (session 2026-11-27d), call Q9: the decode-size MoE down launch summing each token's top-k entries
# from one [slots, BLOCK_N, BLOCK_K] load a K step. MoE GPU tests; kernel benchmark (fused against grouped);
# Qwen3-30B-A3B batch-1 decode, the tree before (75e4696: per-entry rows and torch's sum, in .wt/prev) and this
# one alternated.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 80 python -m benchmarks.moe_kernel --tokens 1,2,4 --out $OUT/kernel > $OUT/moe-kernel.log 2>&1; echo "kernel rc=$?"; grep -vE "^wrote|^/" $OUT/moe-kernel.log | tail -8
lat() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m infer_core.cli bench latency --model Qwen3-30B-A3B --peers floor \
     --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$?"; grep -E "^(infer|floor) " $OUT/$1.log
}
lat lat-prev-1 $HERE/.wt/prev
lat lat-new-1 $HERE
lat lat-prev-2 $HERE/.wt/prev
lat lat-new-2 $HERE
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py tests/test_hf_parity.py \
  -k "moe or mixtral or gemv" -rfE > $OUT/moe-gpu-tests.log 2>&1; echo "tests rc=$?"; tail -4 $OUT/moe-gpu-tests.log
