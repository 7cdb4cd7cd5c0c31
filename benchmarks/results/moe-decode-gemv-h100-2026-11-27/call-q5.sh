# Issue 27 (session 2026-11-27d), call Q5: tiles of the decode-size MoE GEMVs at Qwen3-30B-A3B's shapes
# (benchmarks/moe_gemv_sweep.py), and Qwen3-30B-A3B (dummy bf16) on the nano-vllm offline workload.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 240 python -m benchmarks.moe_gemv_sweep --out $OUT/sweep > $OUT/moe-gemv-sweep.log 2>&1; echo "sweep rc=$?"; grep -E "^T=" $OUT/moe-gemv-sweep.log
timeout 250 python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --load-format dummy --workload nano-vllm \
  --out $OUT/offline > $OUT/moe-offline.log 2>&1; echo "offline rc=$?"; grep -vE "it/s\]|s/it\]" $OUT/moe-offline.log | tail -8
