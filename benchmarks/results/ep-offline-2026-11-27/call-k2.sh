# Call K2 (2 GPUs): benchmarks.ep (batch-1 decode, then nano-vllm's first 128 prompts; each run in a fresh process)
# for main before this session (.wt/base: single, EP=2 all_reduce) and this tree (single, EP=2 all_reduce, EP=2
# all_to_all, TP=2), after this tree's align kernel timed alone (benchmarks.decode_step_sweep); then this tree's EP=2 all_to_all under torch.profiler for its first two prefill steps.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
ep() {  # tree runs limit
  local dir=$([ $1 = new ] && echo $HERE || echo $HERE/.wt/$1)
  (cd $dir && env PYTHONPATH="$(tree_path $dir)" timeout $3 python -m benchmarks.ep --only $2 --num-prompts 128 \
     --repeats 2 --timeout 150 --out $OUT/$1 > $OUT/ep-$1.log 2>&1)
  echo "[$1] rc=$? at ${SECONDS}s"; grep -E "^\[|throughput_vs|output_tok_s\"" $OUT/ep-$1.log | grep -vE "it/s" | tail -12
}
timeout 60 python -m benchmarks.decode_step_sweep > $OUT/sweep.log 2>&1; echo "sweep rc=$? at ${SECONDS}s"
grep moe_align $OUT/sweep.log
ep base single,ep2-all-reduce 150
ep new single,ep2-all-reduce,ep2,tp2 290
left=$(( 575 - SECONDS ))
if [ $left -gt 60 ]; then
  INFER_EXPERT_PARALLEL_SIZE=2 timeout $left python -m infer_core.cli bench throughput --model Qwen3-30B-A3B \
    --num-prompts 128 --timeout 150 --profile --profile-skip 0 --profile-steps 2 --out $OUT/prof --trace $OUT/prof \
    > $OUT/prof-a2a.log 2>&1; echo "[prof] rc=$? at ${SECONDS}s"
  grep -E "^  (prefill|decode)|tok/s" $OUT/prof-a2a.log | tail -7
fi
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; ls -la $OUT
echo "done in $SECONDS s"
