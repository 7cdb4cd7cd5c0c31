# Issue 26, call P6: the long-context FP8 KV workload (benchmarks/kv_fp8.py --rows fp8:triton) on three trees,
# alternated twice: this (float16 dots, 128-key tiles), bn64 (float16 dots, 64-key tiles), base2 (the tree before:
# bfloat16 dots, 64-key tiles). P5 had this tree at 8.89 s against base2's 8.07.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
for round in 1 2; do
  for tree in this bn64 base2; do
    (cd .wt/$tree && PYTHONPATH=$(tree_path $HERE/.wt/$tree) timeout 120 python -m benchmarks.kv_fp8 --rows fp8:triton --out $OUT/$tree-$round > $OUT/$tree-$round.log 2>&1)
    echo "$tree round $round: $(grep -E 'triton: ' $OUT/$tree-$round.log | tr -s ' ')"
  done
done
