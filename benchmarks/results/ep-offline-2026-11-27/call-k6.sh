# Call K6 (2 GPUs): the one-launch expert grouping up to 4,096 entries (was 1,024: decode steps past 128 tokens
# sorted with torch ops, 2.5 ms a step in call K5's profile at batch 256). Its GPU tests, then
# `infer bench throughput` on nano-vllm's whole workload (256 prompts) for one GPU and EP=2, this tree and main
# before it (.wt/base), alternated.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 90 python -m pytest -q -p no:cacheprovider -m gpu tests/fused/test_moe_gpu.py -rfE \
  -k "one_launch_router_and_grouping or fused_experts_at_qwen3_30b_a3b_shapes" > $OUT/gpu-tests-moe.log 2>&1
echo "[moe tests] rc=$? at ${SECONDS}s"; tail -1 $OUT/gpu-tests-moe.log
thr() {  # tree run
  local dir=$([ $1 = new ] && echo $HERE || echo $HERE/.wt/$1)
  (cd $dir && env PYTHONPATH="$(tree_path $dir)" $([ $2 = ep2 ] && echo INFER_EXPERT_PARALLEL_SIZE=2) \
     timeout $(( 470 - SECONDS )) python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 256 \
     --timeout 150 --out $OUT/$1-$2 > $OUT/thr-$1-$2.log 2>&1)
  echo "[$1 $2] rc=$? at ${SECONDS}s"; grep -vE "it/s\]|s/it\]" $OUT/thr-$1-$2.log | grep -E "^infer |^  (prefill|decode (65|129|193))"
}
thr new single; thr base single; thr new ep2; thr base ep2
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; ls $OUT
echo "done in $SECONDS s"
