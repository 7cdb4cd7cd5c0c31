# Session 2026-11-27g, call D3: the norm of 2048-wide rows (and the qkv / gate_up GEMV after it) at 8 warps, on
# main (this tree) against the tree before (.wt/base): GPU tests of the fused kernels; the fused chains of a dense
# 2048-wide model (Qwen3-1.7B) at a grid of tiles; batch-1 decode of Qwen3-30B-A3B and Qwen3-1.7B, alternated;
# Qwen3-30B-A3B's decode graph per kernel on flash attention (D2: flash 4.19 ms a token against triton's 3.68).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_norm_gemv_gpu.py tests/fused/test_gemv_gpu.py \
  tests/fused/test_gpu.py -rfE > $OUT/gpu-tests.log 2>&1; echo "tests rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests.log
timeout 120 python -m benchmarks.gemv --fused --sweep --models Qwen3-1.7B --rows 1 2 --out $OUT/fused-sweep-1.7b \
  > $OUT/fused-sweep-1.7b.log 2>&1; echo "fused sweep rc=$? at ${SECONDS}s"; grep -E "Qwen3|sweep |saved" $OUT/fused-sweep-1.7b.log
lat() {  # name tree model attention
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m infer_core.cli bench latency --model $3 \
     --attention $4 --peers floor --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^(infer|floor) " $OUT/$1.log
}
lat lat-30b-base $HERE/.wt/base Qwen3-30B-A3B triton
lat lat-30b-new $HERE Qwen3-30B-A3B triton
lat lat-1.7b-base $HERE/.wt/base Qwen3-1.7B triton
lat lat-1.7b-new $HERE Qwen3-1.7B triton
lat lat-1.7b-base-2 $HERE/.wt/base Qwen3-1.7B triton
lat lat-1.7b-new-2 $HERE Qwen3-1.7B triton
timeout 110 python -m benchmarks.graph_kernels --model benchmarks/configs/Qwen3-30B-A3B --attention flash \
  --out $OUT/kernels-30b-flash > $OUT/kernels-30b-flash.log 2>&1; echo "kernels flash rc=$? at ${SECONDS}s"
grep -E "graph of|us adds" $OUT/kernels-30b-flash.log | head -14
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; echo "end at ${SECONDS}s"
