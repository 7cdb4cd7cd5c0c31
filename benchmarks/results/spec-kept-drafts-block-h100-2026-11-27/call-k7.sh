# Issue 28/26 (session 2026-11-27f), call K7, after the review: the kept-drafts kernel unspecialised on pointer
# alignment and warmed up with the runner's argument types (the GPU test now asserts no variant compiled after start);
# the W8 GEMV's SiLU K step never widened past a scale group. The tests that cover them, on CUDA.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 85 python -m pytest -q -p no:cacheprovider plugins/spec_decode/tests/test_gpu.py -k "overlapped or gemv" \
  plugins/quant_w8a8/tests/test_gemv.py -rfE > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -4 $OUT/gpu-tests.log
