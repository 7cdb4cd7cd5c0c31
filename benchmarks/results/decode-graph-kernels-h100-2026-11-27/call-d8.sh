# Session 2026-11-27g, call D8: D7 named _decode_kernel and _prefill_kernel variants made after the triton server's
# 'ready'; this time the probe logs each variant's specialisation key and constexprs. One run, 16-token pages.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$(pwd)/benchmarks/results/decode-graph-kernels-h100-2026-11-27/compile-probe:$PYTHONPATH
export TMPDIR=$OUT
python benchmarks/word_tokenizer.py --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
timeout 150 python -m infer_core.cli bench serve --start-server "--model $(pwd)/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer --attention triton" \
  --concurrency 256 --endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress \
  --label probe --json $OUT/serve-probe.json > $OUT/serve-probe.log 2>&1
echo "serve rc=$? at ${SECONDS}s"
log=$(ls -t $OUT/infer-bench-serve-*/serve.log | head -1); grep -v "httpx\|POST" $log > $OUT/server-probe.log
ready=$(grep -m1 " ready: " $log | cut -c12-23); echo "ready at $ready"
grep -E "TRITON-VARIANT (_decode_kernel|_prefill_kernel)" $log | cut -c1-2200
rm -rf $OUT/infer-bench-serve-*
