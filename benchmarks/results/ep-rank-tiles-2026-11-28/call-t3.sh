# Call T3 (2 GPUs): the GPU tests with the time they need (T2 cut them at 200 s), then a second pair of runs, one GPU first.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:${PYTHONPATH:-}"; }
(export PYTHONPATH="$(tree_path $HERE)"; timeout 330 python -m pytest -q -p no:cacheprovider -m gpu plugins/parallel_ep/tests/test_gpu.py tests/fused/test_moe_gpu.py -rfE > $OUT/gpu-tests.log 2>&1; echo "[gpu tests] rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests.log)
thr() {  # tree run
  local dir=$([ $1 = new ] && echo $HERE || echo $HERE/.wt/$1)
  (cd $dir && env PYTHONPATH="$(tree_path $dir)" $([ $2 = ep2 ] && echo INFER_EXPERT_PARALLEL_SIZE=2) \
     timeout $(( 590 - SECONDS )) python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 256 \
     --timeout 200 --out $OUT/$1-$2 > $OUT/thr-$1-$2.log 2>&1)
  echo "[$1 $2] rc=$? at ${SECONDS}s"; grep -vE "it/s\]|s/it\]" $OUT/thr-$1-$2.log | grep -E "^infer |^  (prefill|decode)"
}
thr new single; thr new ep2
echo "done in $SECONDS s"
