# Call K5, asked as nvidia-h100-x2. On an H100 pair (where one GPU holds the whole Qwen3-30B-A3B beside 254 KV
# blocks, and the issue names that kind too): benchmarks.ep on nano-vllm's whole workload (one GPU, EP=2, TP=2),
# then the triton attention GPU tests. On H200s again: those tests first, then the step timeline of one GPU and of
# EP=2 on the whole workload (where EP=2's time goes by decode batch size).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
triton_tests() {
  timeout $(( $1 - SECONDS )) python -m pytest -q -p no:cacheprovider -m gpu plugins/attention_triton/tests -rfE \
    > $OUT/gpu-tests-triton.log 2>&1; echo "[triton tests] rc=$? at ${SECONDS}s"; tail -2 $OUT/gpu-tests-triton.log
}
if nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H100; then
  timeout 420 python -m benchmarks.ep --only single,ep2,tp2 --num-prompts 256 --repeats 2 --timeout 200 \
    --out $OUT/k5 > $OUT/ep-k5.log 2>&1
  echo "[bench] rc=$? at ${SECONDS}s"; grep -E "^\[[a-z0-9-]+\] (decode|throughput)|throughput_vs|kv_blocks" $OUT/ep-k5.log
  triton_tests 575
else
  triton_tests 300
  for run in single ep2; do
    env $([ $run = ep2 ] && echo INFER_EXPERT_PARALLEL_SIZE=2) timeout $(( 570 - SECONDS )) python -m infer_core.cli \
      bench throughput --model Qwen3-30B-A3B --num-prompts 256 --timeout 200 --out $OUT/thr-$run \
      > $OUT/thr-$run.log 2>&1
    echo "[thr-$run] rc=$? at ${SECONDS}s"; grep -vE "it/s\]|s/it\]" $OUT/thr-$run.log | grep -E "^  (prefill|decode)|^infer "
  done
fi
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; ls $OUT
echo "done in $SECONDS s"
