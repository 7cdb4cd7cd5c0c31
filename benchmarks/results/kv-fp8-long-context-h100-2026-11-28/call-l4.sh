# Issue 26, call L4 (after L3 on the same machine): Qwen3-8B offline (nano-vllm workload, dummy weights): bf16, FP8
# W8A8 + FP8 KV on this tree (the norm and the activation quantization in one launch at GEMM sizes, the FP8 tiles),
# and on base; then the W8A8 plugin's GPU tests.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
mkdir -p $OUT/q26
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
run() {  # name tree env...
  local name=$1 tree=$2; shift 2
  (cd $tree && env PYTHONPATH="$(tree_path $tree)" "$@" timeout 150 python -m infer_core.cli bench throughput --model Qwen3-8B \
     --load-format dummy --workload nano-vllm --out $OUT/q26/$name > $OUT/q26/$name.log 2>&1)
  echo "$name rc=$? ${SECONDS}s: $(grep -E '^infer ' $OUT/q26/$name.log | tail -1 | tr -s ' ')"
}
run bf16 $HERE
run fp8-kvfp8 $HERE INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
run fp8-kvfp8-base $HERE/.wt/base INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
(cd $HERE && PYTHONPATH=$(tree_path $HERE) timeout $((570 - SECONDS)) python -m pytest -q -m gpu plugins/quant_w8a8/tests -p no:cacheprovider -rfE > $OUT/gpu-tests-2.log 2>&1; echo "w8a8 tests rc=$? ${SECONDS}s"; tail -2 $OUT/gpu-tests-2.log)
