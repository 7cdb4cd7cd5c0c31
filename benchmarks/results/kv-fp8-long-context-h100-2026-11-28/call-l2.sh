# Issue 26, call L2 (nvidia-h100-x1, after L1 on the same machine): where the long-context workload's time goes
# (lc_profile.py), FP8 on triton and bf16 on flash.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
R=benchmarks/results
PYTHONPATH=$(tree_path $HERE) timeout 300 python $R/kv-fp8-long-context-h100-2026-11-28/lc_profile.py --rows fp8:triton auto:auto --out $OUT/lc-profile.json > $OUT/lc-profile.log 2>&1
echo "lc profile rc=$? ${SECONDS}s"; cat $OUT/lc-profile.log | grep -v "^\[" | tail -45
