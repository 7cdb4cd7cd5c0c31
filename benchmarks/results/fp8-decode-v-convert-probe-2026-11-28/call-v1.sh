# Issue 26, call V1 (nvidia-h100-x1): the FP8 decode kernel with its V tiles converted where loaded (fp8.e4m3_to_f16)
# against base (main at 03804f8, the plain conversion): decode_ab.py in both trees, alternated; the long-context
# workload in both (benchmarks.kv_fp8, alternated); the triton plugin's FP8 and decode GPU tests; Qwen3-8B offline
# FP8 W8A8 + FP8 KV on this tree (bf16 and base from call L4 of the same day).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
R=$HERE/benchmarks/results/fp8-decode-v-convert-probe-2026-11-28
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
for tree in this base; do
  if [ $tree = this ]; then d=$HERE; else d=$HERE/.wt/base; fi
  (cd $d && PYTHONPATH=$(tree_path $d) timeout 60 python $R/decode_ab.py $tree >> $OUT/decode-ab.jsonl 2>> $OUT/decode-ab.err)
  echo "decode_ab $tree rc=$? ${SECONDS}s"
done
python - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/decode-ab.jsonl")]
for r in rows:
    if r["chosen"] or r["kv"] == "fp8":
        print(r["tree"], r["cell"], r["kv"], "splits", r["splits"], "*" if r["chosen"] else " ", r["us"], "us", r["gb_s"], "GB/s", r["max_diff_vs_chosen"])
PY
for tree in this base; do
  if [ $tree = this ]; then d=$HERE; else d=$HERE/.wt/base; fi
  rows="fp8:triton"; [ $tree = this ] && rows="auto:auto fp8:triton"
  (cd $d && PYTHONPATH=$(tree_path $d) timeout 110 python -m benchmarks.kv_fp8 --rows $rows --out $OUT/kv-$tree > $OUT/kv-$tree.log 2>&1)
  echo "kv $tree rc=$? ${SECONDS}s: $(grep -E 'flash: |triton: ' $OUT/kv-$tree.log | tr -s ' ')"
done
(cd $HERE && PYTHONPATH=$(tree_path $HERE) timeout 150 python -m pytest -q -m gpu plugins/attention_triton/tests/test_kv_fp8.py plugins/attention_triton/tests/test_decode_merge_gpu.py -p no:cacheprovider -rfE > $OUT/gpu-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -n 2 $OUT/gpu-tests.log)
mkdir -p $OUT/q26
(cd $HERE && env PYTHONPATH="$(tree_path $HERE)" INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8 timeout $(( SECONDS < 420 ? 440 - SECONDS : 20 )) python -m infer_core.cli bench throughput --model Qwen3-8B --load-format dummy --workload nano-vllm --out $OUT/q26/fp8-kvfp8 > $OUT/q26/fp8-kvfp8.log 2>&1)
echo "offline fp8-kvfp8 rc=$? ${SECONDS}s: $(grep -E '^infer ' $OUT/q26/fp8-kvfp8.log | tail -1 | tr -s ' ')"
