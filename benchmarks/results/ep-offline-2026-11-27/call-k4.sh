# For the next session's first call, asked as nvidia-h100-x2 (where the whole Qwen3-30B-A3B fits one H100 beside
# 254 KV blocks; the issue names that kind too): EP=2's GPU tests with the load read back asynchronously
# (device_load.py) and the grouping kernel's tile caps, neither yet run on a GPU, then benchmarks.ep on nano-vllm's whole workload (one GPU, EP=2, TP=2),
# (the triton attention GPU tests K3 ran out of time for go to a one-GPU call).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py plugins/parallel_ep/tests/test_gpu.py -rfE \
  > $OUT/gpu-tests-ep.log 2>&1; echo "[ep tests] rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests-ep.log
timeout 300 python -m benchmarks.ep --only single,ep2,tp2 --num-prompts 256 --repeats 2 --timeout 140 \
  --out $OUT/k4 > $OUT/ep-k4.log 2>&1
echo "[bench] rc=$? at ${SECONDS}s"; grep -E "^\[[a-z0-9-]+\] (decode|throughput)|throughput_vs" $OUT/ep-k4.log
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; ls $OUT
echo "done in $SECONDS s"
