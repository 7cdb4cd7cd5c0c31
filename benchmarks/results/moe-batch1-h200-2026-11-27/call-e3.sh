# Session 2026-11-27h, call E3 on nvidia-h200: E2's tree (0.540 of the floor) plus the MoE block's post-attention
# norm computed in the router's GEMV launch (which also stores the normed rows the experts read): one launch fewer a
# layer. This tree against main before the session (.wt/base), alternated; its decode graph per kernel; the MoE and
# GEMV GPU tests.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
tree() { [ $1 = new ] && echo $HERE || echo $HERE/.wt/$1; }
lat() {  # tree round
  (cd $(tree $1) && env PYTHONPATH="$(tree_path $(tree $1))" timeout 100 python -m infer_core.cli bench latency \
     --model Qwen3-30B-A3B --attention triton --peers floor --out $OUT/lat-$1-$2 > $OUT/lat-$1-$2.log 2>&1)
  echo "lat $1 $2 rc=$? at ${SECONDS}s $(grep -E '^infer ' $OUT/lat-$1-$2.log)"
}
for r in 1 2; do lat base $r; lat new $r; done
timeout 100 python -m benchmarks.graph_kernels --model benchmarks/configs/Qwen3-30B-A3B --attention triton \
  --out $OUT/kernels-new > $OUT/kernels-new.log 2>&1; echo "kernels rc=$? at ${SECONDS}s"
grep -E "graph of|us adds" $OUT/kernels-new.log | head -10
timeout $((585 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py \
  tests/fused/test_gemv_gpu.py tests/test_hf_parity.py -k "moe or mixtral or gemv" -rfE > $OUT/gpu-tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests.log
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; tar czf logs.tgz lat-*.log && rm lat-*.log
echo "end at ${SECONDS}s"
