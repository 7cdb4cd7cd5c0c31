# Call K1 (nvidia-h100-x1): the decode-attention split and align-kernel sweep (benchmarks/decode_step_sweep.py),
# then last session's call E6: issue 27's kernel bar with the current tiles, and flash's engine GPU tests.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 150 python -m benchmarks.decode_step_sweep --out $OUT > $OUT/sweep.log 2>&1; echo "sweep rc=$? at ${SECONDS}s"
timeout 200 python -m benchmarks.moe_kernel --tokens 1,2,4,8,16,64 --out $OUT/kernel > $OUT/moe-kernel.log 2>&1
echo "kernel rc=$? at ${SECONDS}s"; grep -vE "^wrote|^/" $OUT/moe-kernel.log | tail -14
timeout $((570 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_flash/tests/test_engine_gpu.py \
  -rfE > $OUT/gpu-tests-flash.log 2>&1; echo "flash tests rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests-flash.log
