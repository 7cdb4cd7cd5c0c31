# Session 2026-11-27g, call D7: D6's server on triton attention ran its prefill steps at 121 ms (19 of them; the
# offline engine 21 ms), TTFT 2.2 s at c=256. Which Triton kernel variants does the server make after 'ready'?
# (compile-probe/sitecustomize.py logs each variant a process compiles or loads.) Default 16-token pages, then 256.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$(pwd)/benchmarks/results/decode-graph-kernels-h100-2026-11-27/compile-probe:$PYTHONPATH
export TMPDIR=$OUT
python benchmarks/word_tokenizer.py --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
serve() {  # label extra-server-args
  timeout 150 python -m infer_core.cli bench serve --start-server "--model $(pwd)/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer --attention triton $2" \
    --concurrency 256 --endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress \
    --label $1 --json $OUT/serve-$1.json > $OUT/serve-$1.log 2>&1
  echo "serve $1 rc=$? at ${SECONDS}s"
  grep -v httpx $OUT/serve-$1.log | grep -E "output throughput|TTFT|core steps" | tail -3
  log=$(ls -t $OUT/infer-bench-serve-*/serve.log | head -1); cp $log $OUT/server-$1.log
  ready=$(grep -m1 " ready: " $log | cut -c12-23); echo "ready at $ready; variants after it:"
  awk -v r="$ready" '/TRITON-VARIANT/ && $1 > r' $log | cut -c1-330 | head -12
  echo "variants in all: $(grep -c TRITON-VARIANT $log), after ready: $(awk -v r="$ready" '/TRITON-VARIANT/ && $1 > r' $log | wc -l)"
}
serve triton16 ""
serve triton256 "--block-size 256"
rm -rf $OUT/infer-bench-serve-*; cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete
echo "end at ${SECONDS}s"
