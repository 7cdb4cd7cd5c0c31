# Session 2026-11-27h, call E4 on nvidia-h200: E3's tree reached 0.545 of the floor (bar 0.55). Two tile variants of
# the experts' GEMVs, built here from this tree and .wt/patches: g2 = gate_up's gate and up tiles together the dense
# GEMV's one tile (2 x 2048 at 4 warps at one token, was 4 x 2048 at 8; best of the standalone Q5 sweep on H100),
# g2d = g2 + the down launch asking L2 for all of K before its PDL wait (was its first K step). Alternated latency,
# each variant's decode graph per kernel; then the triton attention GPU tests in the time left.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
for t in g2 g2d; do
  mkdir -p .wt/$t && tar cf - --exclude=./.wt --exclude=./.device --exclude=./.git --exclude=./benchmarks/results . \
    | tar xf - -C .wt/$t && git apply --directory=.wt/$t .wt/patches/$t.patch || exit 1
done
grep -c "cfg.block_n // 2" .wt/g2/infer_core/layers/fused/moe_gemv.py .wt/g2d/infer_core/layers/fused/moe_gemv.py \
  infer_core/layers/fused/moe_gemv.py; grep -c "cdiv(inter \* element_size" .wt/g2d/infer_core/layers/fused/moe_gemv.py
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
tree() { [ $1 = new ] && echo $HERE || echo $HERE/.wt/$1; }
lat() {  # tree round
  (cd $(tree $1) && env PYTHONPATH="$(tree_path $(tree $1))" timeout 120 python -m infer_core.cli bench latency \
     --model Qwen3-30B-A3B --attention triton --peers floor --out $OUT/lat-$1-$2 > $OUT/lat-$1-$2.log 2>&1)
  echo "lat $1 $2 rc=$? at ${SECONDS}s $(grep -E '^infer ' $OUT/lat-$1-$2.log)"
}
kernels() {
  (cd $(tree $1) && env PYTHONPATH="$(tree_path $(tree $1))" timeout 100 python -m benchmarks.graph_kernels \
     --model $HERE/benchmarks/configs/Qwen3-30B-A3B --attention triton --out $OUT/kernels-$1 > $OUT/kernels-$1.log 2>&1)
  echo "kernels $1 rc=$? at ${SECONDS}s"; grep -E "graph of|us adds" $OUT/kernels-$1.log | head -6
}
for t in new g2 g2d; do lat $t 1; done
for t in g2 g2d; do kernels $t; done
for t in g2d g2 new; do lat $t 2; done
timeout $((585 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_triton/tests -rfE \
  > $OUT/gpu-tests-triton.log 2>&1; echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests-triton.log
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; tar czf logs.tgz lat-*.log && rm lat-*.log
echo "end at ${SECONDS}s"
