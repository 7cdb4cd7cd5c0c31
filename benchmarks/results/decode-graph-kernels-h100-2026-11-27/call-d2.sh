# Session 2026-11-27g, call D2 (issue 27, batch-1 decode): D1 showed Qwen3-30B-A3B's input-norm + qkv launch
# (N=5120, K=2048) adding 18.5 us a layer against a ~6.3 us bytes floor: it runs at the 2 warps of the norm of
# 2048-wide rows (16x256 tiles, 3 stages). (1) the fused chain at a grid of tiles; (2) the plain GEMV cells of
# that model; (3) batch-1 decode: main (this tree) against .wt/a (rms_norm.LARGE_ROW 2048: the norm and the GEMV
# after it at 8 warps from 2048-wide rows), on triton, and main on flash (D1's graph ran triton attention:
# 3,655 us a replay, where `bench latency` on flash measured 4,198 us a token).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
timeout 150 python -m benchmarks.gemv --fused --sweep --models Qwen3-30B-A3B --rows 1 2 --out $OUT/fused-sweep \
  > $OUT/fused-sweep.log 2>&1; echo "fused sweep rc=$? at ${SECONDS}s"; grep -E "Qwen3|sweep " $OUT/fused-sweep.log
timeout 60 python -m benchmarks.gemv --models Qwen3-30B-A3B --rows 1 2 --out $OUT/plain-cells \
  > $OUT/plain-cells.log 2>&1; echo "plain cells rc=$? at ${SECONDS}s"; grep -E "Qwen3|qkv|lm_head| o " $OUT/plain-cells.log | head -20
lat() {  # name tree attention
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m infer_core.cli bench latency --model Qwen3-30B-A3B \
     --attention $3 --peers floor --out $OUT/$1 > $OUT/$1.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^(infer|floor) " $OUT/$1.log
}
lat lat-main-triton $HERE triton
lat lat-a-triton $HERE/.wt/a triton
lat lat-main-flash $HERE flash
[ $SECONDS -lt 470 ] && lat lat-a-triton-2 $HERE/.wt/a triton
[ $SECONDS -lt 470 ] && lat lat-main-triton-2 $HERE triton
echo "end at ${SECONDS}s"
