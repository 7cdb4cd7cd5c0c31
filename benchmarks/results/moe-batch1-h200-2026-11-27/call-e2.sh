# Session 2026-11-27h, call E2 on nvidia-h200: E1 gained 2.6% (0.504 -> 0.517 of the floor), but its graph showed the
# attention launch 140 us longer than D5's; o_proj's one-step tile, loaded before its PDL wait, may slow the
# attention launch it overlaps. Trees (built here from .wt/base and .wt/patches): base = main before this session;
# ab = base + the routing and down changes; abd = ab + the decode attention asking L2 for its first tile before its
# PDL wait; new = this tree (ab + o_proj's tile + d). Batch-1 latency alternated, each tree's decode graph per kernel.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
for t in ab abd; do cp -r .wt/base .wt/$t; done
(cd .wt/ab && git apply ../patches/ab.patch) && (cd .wt/abd && git apply ../patches/ab.patch ../patches/d.patch) || exit 1
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
tree() { [ $1 = new ] && echo $HERE || echo $HERE/.wt/$1; }
lat() {  # tree round
  (cd $(tree $1) && env PYTHONPATH="$(tree_path $(tree $1))" timeout 100 python -m infer_core.cli bench latency \
     --model Qwen3-30B-A3B --attention triton --peers floor --out $OUT/lat-$1-$2 > $OUT/lat-$1-$2.log 2>&1)
  echo "lat $1 $2 rc=$? at ${SECONDS}s $(grep -E '^infer ' $OUT/lat-$1-$2.log)"
}
kernels() {
  (cd $(tree $1) && env PYTHONPATH="$(tree_path $(tree $1))" timeout 100 python -m benchmarks.graph_kernels \
     --model $HERE/benchmarks/configs/Qwen3-30B-A3B --attention triton --out $OUT/kernels-$1 > $OUT/kernels-$1.log 2>&1)
  echo "kernels $1 rc=$? at ${SECONDS}s"; grep -E "graph of|us adds" $OUT/kernels-$1.log | head -10
}
for t in base ab abd new; do lat $t 1; done
for t in base abd new; do kernels $t; done
for t in new abd ab base; do lat $t 2; done
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; tar czf logs.tgz lat-*.log && rm lat-*.log
echo "end at ${SECONDS}s"
