# Call K3 (2 GPUs): this tree (EP's default dispatch now all_reduce, rank 0 counting its routing) on nano-vllm's
# whole offline workload (256 prompts): benchmarks.ep for one GPU, EP=2, EP=2 all_to_all and TP=2, each in a fresh
# process (batch-1 decode, then the workload); then the GPU tests of the changed kernels and of the EP plugin.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
timeout 330 python -m benchmarks.ep --only single,ep2,ep2-all-to-all,tp2 --num-prompts 256 --repeats 2 --timeout 150 \
  --out $OUT/k3 > $OUT/ep-k3.log 2>&1
echo "[bench] rc=$? at ${SECONDS}s"; grep -E "^\[[a-z0-9-]+\] (decode|throughput)|throughput_vs" $OUT/ep-k3.log
timeout $((560 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py \
  plugins/parallel_ep/tests/test_gpu.py -rfE > $OUT/gpu-tests-moe-ep.log 2>&1
echo "[moe/ep tests] rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests-moe-ep.log
timeout $((575 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_triton/tests -rfE \
  > $OUT/gpu-tests-triton.log 2>&1; echo "[triton tests] rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests-triton.log
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; ls $OUT
echo "done in $SECONDS s"
