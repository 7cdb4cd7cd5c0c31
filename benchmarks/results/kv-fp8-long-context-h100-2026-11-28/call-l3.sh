# Issue 26, call L3 (nvidia-h100-x1): the long-context workload (benchmarks.kv_fp8, 32 x 7,900 tokens, 256 new,
# Qwen3-0.6B) with the FP8 tiles from attn_sweep.py (prefill 128-key tiles, decode aiming at four programs an SM)
# and float16 prefill dots, against base (main before this session), alternated; bf16 on the default backend once.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
for round in 1 2; do
  for tree in this base; do
    if [ $tree = this ]; then d=$HERE; else d=$HERE/.wt/base; fi
    rows="fp8:triton"; [ $round = 1 ] && [ $tree = this ] && rows="auto:auto fp8:triton"
    (cd $d && PYTHONPATH=$(tree_path $d) timeout 150 python -m benchmarks.kv_fp8 --rows $rows --out $OUT/kv-$tree-$round > $OUT/kv-$tree-$round.log 2>&1)
    echo "$tree round $round rc=$? ${SECONDS}s: $(grep -E 'flash: |triton: ' $OUT/kv-$tree-$round.log | tr -s ' ')"
  done
done
(cd $HERE && PYTHONPATH=$(tree_path $HERE) timeout 200 python -m pytest -q -m gpu plugins/attention_triton/tests/test_kv_fp8.py plugins/attention_triton/tests/test_decode_merge_gpu.py plugins/quant_w8a8/tests/test_norm_quant.py -p no:cacheprovider -rfE > $OUT/gpu-tests-1.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -2 $OUT/gpu-tests-1.log)
