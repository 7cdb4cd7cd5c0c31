# Session 2026-11-27g, call D9 (nvidia-h100-x1): the triton backend with no kernel variant compiled mid-run (D7/D8:
# its server compiled decode and prefill variants after 'ready'). GPU tests (the new no-variant-after-start test,
# the triton plugin's), the server at c=256 on triton (with the compile probe) and on flash, then batch-1 decode on
# triton, main against the tree before (.wt/base).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_triton/tests/test_gpu.py -rfE \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests.log
export TMPDIR=$OUT
python benchmarks/word_tokenizer.py --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
serve() {  # label attention probe(0/1)
  extra=""; [ "$3" = 1 ] && extra="$HERE/benchmarks/results/decode-graph-kernels-h100-2026-11-27/compile-probe:"
  env PYTHONPATH="$extra$PYTHONPATH" timeout 120 python -m infer_core.cli bench serve --start-server "--model $HERE/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer --attention $2" \
    --offline-row --concurrency 256 --endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress \
    --label $1 --json $OUT/serve-$1.json > $OUT/serve-$1.log 2>&1
  echo "serve $1 rc=$? at ${SECONDS}s"
  grep -v httpx $OUT/serve-$1.log | grep -E "output throughput|TTFT|core steps|of offline" | tail -6
  log=$(ls -t $OUT/infer-bench-serve-*/serve.log | head -1); grep -v "httpx\|POST" $log > $OUT/server-$1.log
  ready=$(grep -m1 " ready: " $log | cut -c12-23)
  echo "variants after ready ($ready): $(awk -v r="$ready" '/TRITON-VARIANT/ && $1 > r' $log | wc -l)"
  awk -v r="$ready" '/TRITON-VARIANT/ && $1 > r' $log | cut -c1-120 | head -5
}
serve triton triton 1
serve flash flash 0
lat() {  # name tree
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 60 python -m infer_core.cli bench latency --model Qwen3-0.6B \
     --attention triton --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^infer " $OUT/$1.log
}
lat lat-base $HERE/.wt/base
lat lat-new $HERE
rm -rf $OUT/infer-bench-serve-*; cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete
echo "end at ${SECONDS}s"
