# For the next session's first call (nvidia-h100-x1: issue 27's kernel bar is on an H100): the MoE kernel benchmark
# with this session's tiles and L2 requests (fused >= 60% of the active-bytes floor at 1-16 tokens, >= 3x the
# per-expert cuBLAS loop at 64), and flash's engine GPU tests, which E5 ran out of time for.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 200 python -m benchmarks.moe_kernel --tokens 1,2,4,8,16,64 --out $OUT/kernel > $OUT/moe-kernel.log 2>&1
echo "kernel rc=$? at ${SECONDS}s"; grep -vE "^wrote|^/" $OUT/moe-kernel.log | tail -14
timeout $((580 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_flash/tests/test_engine_gpu.py \
  -rfE > $OUT/gpu-tests-flash.log 2>&1; echo "flash tests rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests-flash.log
