# Issue 26, call N1: Qwen3-8B batch-1 decode with the input norms in the W8 GEMV's launch (int8: qkv and gate_up;
# FP8: qkv), against the same tree with the core's norm fusions off (fused.NORM_GEMV = torch: the W8 layers then
# run the norm kernel and the plain W8 GEMV, as before the change), alternated; bf16 only in the first run.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
timeout 150 python -m benchmarks.quant_decode --out $OUT/new-1 > $OUT/new-1.log 2>&1; echo "new-1 rc=$? ${SECONDS}s"; grep "tok/s" $OUT/new-1.log
timeout 100 python benchmarks/results/w8-norm-fusion-h100-2026-11-28/unfused_quant_decode.py --out $OUT/unfused-1 --quantizations int8 fp8 > $OUT/unfused-1.log 2>&1; echo "unfused-1 rc=$? ${SECONDS}s"; grep "tok/s" $OUT/unfused-1.log
timeout 100 python -m benchmarks.quant_decode --out $OUT/new-2 --quantizations int8 fp8 > $OUT/new-2.log 2>&1; echo "new-2 rc=$? ${SECONDS}s"; grep "tok/s" $OUT/new-2.log
