# Session 2026-11-27h, call E1 on nvidia-h200 (issue 27's batch-1 bar: Qwen3-30B-A3B >= 0.55 of the active-bytes
# floor on one H200): the routing launch at one warp and one row a decode step, the down GEMV reading its expert
# ids and asking L2 for its first K step before the PDL wait, and o_proj (2048 x 4096) as one 4 x 4096 step,
# against main before them (.wt/base), alternated; the new tree's decode graph per kernel; the MoE GPU tests.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
lat() {  # name tree model
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m infer_core.cli bench latency --model $3 \
     --attention triton --peers floor --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^(infer|floor) " $OUT/$1.log
}
lat lat-30b-base $HERE/.wt/base Qwen3-30B-A3B
lat lat-30b-new $HERE Qwen3-30B-A3B
lat lat-30b-base-2 $HERE/.wt/base Qwen3-30B-A3B
lat lat-30b-new-2 $HERE Qwen3-30B-A3B
timeout 120 python -m benchmarks.graph_kernels --model benchmarks/configs/Qwen3-30B-A3B --attention triton \
  --out $OUT/kernels-30b > $OUT/kernels-30b.log 2>&1; echo "kernels rc=$? at ${SECONDS}s"
grep -E "graph of|us adds" $OUT/kernels-30b.log | head -14
timeout $((580 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py tests/fused/test_gemv_gpu.py \
  -rfE > $OUT/gpu-tests.log 2>&1; echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests.log
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; tar czf logs.tgz lat-*.log && rm lat-*.log
echo "end at ${SECONDS}s"
