# For the next session's first call (nvidia-h100-x1): the GPU tests of what changed after D9 without a GPU run: the
# triton default and its no-variant-after-start test, flash's renamed block-size test, speculative decoding (the
# draft model's backend warmed up, the kept-drafts warm-up only where steps can overlap), and the norm + GEMV tiles
# (SiLU's halved K wherever the norm runs at 8 warps).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 560 python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_triton/tests/test_engine_gpu.py \
  plugins/attention_flash/tests/test_engine_gpu.py plugins/spec_decode/tests/test_gpu.py \
  tests/fused/test_norm_gemv_gpu.py -rfE > $OUT/gpu-tests.log 2>&1; echo "tests rc=$? at ${SECONDS}s"
grep -E "passed|failed|FAILED|ERROR" $OUT/gpu-tests.log | tail -12
