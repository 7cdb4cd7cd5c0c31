# Issue 26, call P4: FP8 KV decode with float16 dots and 128-key tiles. The FP8-cache GPU tests, then Qwen3-8B
# offline (nano-vllm workload, dummy weights): bf16, FP8 W8A8 + FP8 KV on this tree, and the same on the tree
# before the attention change (.wt/base2 = c2c42a9-era HEAD), one after the other.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
(cd plugins/attention_triton && timeout 150 python -m pytest -q -m gpu tests/test_kv_fp8.py tests/test_decode_merge_gpu.py -p no:cacheprovider -rfE > $OUT/fp8-gpu-tests.log 2>&1; tail -2 $OUT/fp8-gpu-tests.log)
mkdir -p $OUT/q26
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
run() {  # name tree env...
  local name=$1 tree=$2; shift 2
  (cd $tree && env PYTHONPATH="$(tree_path $tree)" "$@" timeout 150 python -m infer_core.cli bench throughput --model Qwen3-8B \
     --load-format dummy --workload nano-vllm --out $OUT/q26/$name > $OUT/q26/$name.log 2>&1)
  echo "$name rc=$?: $(grep -E '^infer ' $OUT/q26/$name.log | tail -1 | tr -s ' ')"
  grep -A3 "step timeline" $OUT/q26/$name.log | tail -3
  grep -E "decode 193-256" $OUT/q26/$name.log
}
run bf16 $HERE
run fp8-kvfp8 $HERE INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
run fp8-kvfp8-base $HERE/.wt/base2 INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
