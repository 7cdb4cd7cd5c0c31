# Session 2026-11-27g, call D1: (a) K7, the tests the last stop's review fixes left unrun on CUDA (the kept-drafts
# kernel warmed up with the runner's argument types, no variant compiled after start; the W8 GEMV's SiLU K step);
# (b) what a batch-1 decode step's CUDA graph is made of, per kernel: Qwen3-30B-A3B (issue 27, 0.482 of the floor),
# Qwen3-8B bf16 / int8 / FP8 W8A8 (issue 26, x1.546 / x1.584 of bf16).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 100 python -m pytest -q -p no:cacheprovider plugins/spec_decode/tests/test_gpu.py -k "overlapped or gemv" \
  plugins/quant_w8a8/tests/test_gemv.py -rfE > $OUT/k7-gpu-tests.log 2>&1; echo "tests rc=$? at ${SECONDS}s"
tail -3 $OUT/k7-gpu-tests.log
kernels() {  # name model quantization
  timeout 150 python -m benchmarks.graph_kernels --model benchmarks/configs/$2 --quantization $3 --replays 20 \
    --out $OUT/$1 > $OUT/$1.log 2>&1; echo "$1 rc=$? at ${SECONDS}s"; head -22 $OUT/$1.log | grep -v Warn
}
kernels moe-30b Qwen3-30B-A3B none
kernels q8b-bf16 Qwen3-8B none
kernels q8b-int8 Qwen3-8B int8
kernels q8b-fp8 Qwen3-8B fp8
