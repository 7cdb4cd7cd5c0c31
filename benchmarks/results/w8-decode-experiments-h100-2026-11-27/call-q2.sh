# Issue 26 (session 2026-11-27d), call Q2: call Q1 found the fused launch on 8-bit weights slower in whole decode
# steps (int8 x1.543 -> x1.319). Where: one decode step's projections on 8-bit weights in one CUDA graph, per
# variant of the chains' launches (benchmarks/w8_step.py); and the GPU tests Q1's 120 s cut off.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 200 python -m benchmarks.w8_step --out $OUT/w8-step > $OUT/w8-step.log 2>&1; echo "w8_step rc=$?"; grep -E "M=|Error|error" $OUT/w8-step.log
timeout 300 python -m pytest -q tests/fused/test_norm_gemv.py tests/fused/test_norm_gemv_gpu.py plugins/quant_w8a8/tests/test_fusion.py \
  plugins/quant_w8a8/tests/test_gemv.py -p no:cacheprovider -rfE --durations=5 > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -12 $OUT/gpu-tests.log
