# Session 2026-11-27g, call D5 on nvidia-h200: after D4 (Qwen3-30B-A3B batch-1 0.520 of the floor on triton, bar
# 0.55), what main's decode graph is made of per kernel, and the plain GEMV cells of that model (qkv, o, LM head)
# at a grid of tiles (o_proj, N=2048 K=4096, ran at 0.53 of its floor in D2).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 120 python -m benchmarks.graph_kernels --model benchmarks/configs/Qwen3-30B-A3B --attention triton \
  --out $OUT/kernels-30b > $OUT/kernels-30b.log 2>&1; echo "kernels rc=$? at ${SECONDS}s"
grep -E "graph of|us adds" $OUT/kernels-30b.log | head -14
timeout 200 python -m benchmarks.gemv --sweep --models Qwen3-30B-A3B --rows 1 2 --out $OUT/plain-sweep \
  > $OUT/plain-sweep.log 2>&1; echo "plain sweep rc=$? at ${SECONDS}s"; grep -v -i warn $OUT/plain-sweep.log | tail -30
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; echo "end at ${SECONDS}s"
