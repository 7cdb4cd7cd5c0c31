# Issue 26, call L1 (nvidia-h100-x1): (1) the tensor-core W8 GEMV probe against the plugin's W8 GEMV, one decode
# step's projections of Qwen3-8B; (2) the triton plugin's FP8 tests (the prefill kernel now runs float16 dots on
# an FP8 cache); (3) the long-context workload (benchmarks.kv_fp8), this tree against base (main before it),
# alternated. Call L2 (call-l2.sh): where its time goes.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
R=benchmarks/results
PYTHONPATH=$(tree_path $HERE) timeout 240 python $R/w8-mma-probe-h100-2026-11-28/mma_probe.py --out $OUT/mma-probe.json > $OUT/mma-probe.log 2>&1
echo "mma probe rc=$? ${SECONDS}s"; cat $OUT/mma-probe.log | grep -v "^  " | tail -40
PYTHONPATH=$(tree_path $HERE) timeout 200 python -m pytest -q -x plugins/attention_triton/tests/test_kv_fp8.py -m gpu -p no:cacheprovider > $OUT/test-kv-fp8.log 2>&1
echo "tests rc=$? ${SECONDS}s"; tail -3 $OUT/test-kv-fp8.log
for round in 1 2; do
  for tree in this base; do
    if [ $tree = this ]; then d=$HERE; else d=$HERE/.wt/base; fi
    rows="fp8:triton"; [ $round = 1 ] && [ $tree = this ] && rows="auto:auto fp8:triton"
    (cd $d && PYTHONPATH=$(tree_path $d) timeout 150 python -m benchmarks.kv_fp8 --rows $rows --out $OUT/kv-$tree-$round > $OUT/kv-$tree-$round.log 2>&1)
    echo "$tree round $round rc=$? ${SECONDS}s: $(grep -E 'flash: |triton: ' $OUT/kv-$tree-$round.log | tr -s ' ')"
  done
done
