# Call D2b (2 GPUs, the same warm machine after D2a): main before the change (".wt/base") and this tree, EP=2,
# alternated, then TP=2 on this tree (unchanged by it), the whole offline workload.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:${PYTHONPATH:-}"; }
thr() {  # tree run
  local dir=$([ $1 = new ] && echo $HERE || echo $HERE/.wt/$1)
  (cd $dir && env PYTHONPATH="$(tree_path $dir)" $([ $2 = ep2 ] && echo INFER_EXPERT_PARALLEL_SIZE=2) $([ $2 = tp2 ] && echo INFER_TENSOR_PARALLEL_SIZE=2) \
     timeout $(( 580 - SECONDS )) python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 256 \
     --timeout 200 --out $OUT/$1-$2 > $OUT/thr-$1-$2.log 2>&1)
  echo "[$1 $2] rc=$? at ${SECONDS}s"; grep -vE "it/s\]|s/it\]" $OUT/thr-$1-$2.log | grep -E "^infer |^  (prefill|decode)|piecewise"
}
thr base ep2; thr new ep2; thr new tp2
echo "done in $SECONDS s"
