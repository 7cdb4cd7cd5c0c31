# Issue 25: piecewise CUDA graphs. The rest of the GPU tests, then a second c=256 run with the offline row.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 400 python -m pytest -q -m gpu tests/test_gpu.py tests/test_overlap.py tests/test_moe.py tests/test_structured_gpu.py \
  tests/test_sampler_warm_up.py plugins/attention_flash/tests plugins/attention_triton/tests plugins/spec_decode/tests/test_gpu.py \
  plugins/quant_w8a8/tests/test_gpu.py -p no:cacheprovider --deselect tests/test_gpu.py::test_default_model_on_cuda_matches_hf \
  2>&1 | tee $OUT/gpu-tests.log | grep -E "passed|failed|FAILED|ERROR" | tail -20
export TMPDIR=$OUT
python benchmarks/word_tokenizer.py --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
timeout 170 python -m infer_core.cli bench serve --start-server "--model $(pwd)/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer" \
  --offline-row --concurrency 256 --endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress \
  --label now2 --json $OUT/serve-now2.json > $OUT/bench-now2.log 2>&1
echo "now2 rc=$?"
grep -v httpx $OUT/bench-now2.log | grep -E "^==|output throughput|TTFT|core steps|core time|of offline" | tail -12
