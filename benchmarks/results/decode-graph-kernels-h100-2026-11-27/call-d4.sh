# Session 2026-11-27g, call D4, asked on nvidia-h200 (issue 27's batch-1 bar is on one H200): Qwen3-30B-A3B batch-1
# decode, main (this tree: 2048-wide norms and the GEMV after them at 8 warps) against the tree before
# (.wt/base), triton attention, and main on flash; the same A/B on a dense 2048-wide model (Qwen3-1.7B, alternated,
# D3 could not name it); its fused chains at a grid of tiles; then the fused kernels' GPU tests in the time left.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
lat() {  # name tree model attention
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m infer_core.cli bench latency --model $3 \
     --attention $4 --peers floor --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^(infer|floor) " $OUT/$1.log
}
lat lat-30b-base $HERE/.wt/base Qwen3-30B-A3B triton
lat lat-30b-new $HERE Qwen3-30B-A3B triton
lat lat-30b-new-flash $HERE Qwen3-30B-A3B flash
M17=$HERE/benchmarks/configs/Qwen3-1.7B
lat lat-1.7b-base $HERE/.wt/base $M17 triton
lat lat-1.7b-new $HERE $M17 triton
lat lat-1.7b-base-2 $HERE/.wt/base $M17 triton
lat lat-1.7b-new-2 $HERE $M17 triton
timeout 100 python -m benchmarks.gemv --fused --sweep --models Qwen3-1.7B --rows 1 2 --out $OUT/fused-sweep-1.7b \
  > $OUT/fused-sweep-1.7b.log 2>&1; echo "fused sweep rc=$? at ${SECONDS}s"; grep -E "Qwen3|sweep |saved" $OUT/fused-sweep-1.7b.log
timeout $((585 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_norm_gemv_gpu.py -rfE \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests.log
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; tar czf logs.tgz lat-*.log && rm lat-*.log
echo "end at ${SECONDS}s"
