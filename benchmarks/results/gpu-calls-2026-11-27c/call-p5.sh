# Issue 26, call P5: the long-context FP8 KV workload (benchmarks/kv_fp8.py: 32 x 7,900-token prompts, 256 new
# tokens, Qwen3-0.6B dummy): bf16 KV on the engine's default backend and FP8 KV on triton, this tree; FP8 KV on
# the tree before the attention change (.wt/base2).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 280 python -m benchmarks.kv_fp8 --rows auto:auto fp8:triton --out $OUT/kv-this > $OUT/kv-this.log 2>&1; grep -vE "INFO|WARNING|it/s" $OUT/kv-this.log | tail -6
(cd .wt/base2 && PYTHONPATH=$(tree_path $HERE/.wt/base2) timeout 200 python -m benchmarks.kv_fp8 --rows fp8:triton --out $OUT/kv-base > $OUT/kv-base.log 2>&1; grep -vE "INFO|WARNING|it/s" $OUT/kv-base.log | tail -4)
