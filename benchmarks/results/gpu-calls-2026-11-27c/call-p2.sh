# Issue 26 (session 2026-11-27c), call P2: the one-launch activation quantization with the reciprocal scale (542b11d).
# offline (nano-vllm workload, dummy weights): bf16, FP8, FP8 + FP8 KV on this tree, and FP8 on the base tree
# (77721f9: activations quantized by torch ops), one after the other.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
mkdir -p $OUT/q26
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
run() {  # name tree env...
  local name=$1 tree=$2; shift 2
  (cd $tree && env PYTHONPATH="$(tree_path $tree)" "$@" timeout 200 python -m infer_core.cli bench throughput --model Qwen3-8B \
     --load-format dummy --workload nano-vllm --out $OUT/q26/$name > $OUT/q26/$name.log 2>&1)
  echo "$name rc=$?: $(grep -E '^infer ' $OUT/q26/$name.log | tail -1 | tr -s ' ')"
  grep -A3 "step timeline" $OUT/q26/$name.log | tail -3
  grep -E "decode 193-256" $OUT/q26/$name.log
}
run bf16 $HERE
run fp8 $HERE INFER_QUANTIZATION=fp8
run fp8-kvfp8 $HERE INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
run fp8-base $HERE/.wt/base INFER_QUANTIZATION=fp8
