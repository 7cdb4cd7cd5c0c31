# Call D1 (2 GPUs): the decode attention alone at the offline workload's contexts (splits 1-8), then one GPU's and an
# EP=2 rank's steps in windows of one run of the whole workload (ep_windows.py).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
D=benchmarks/results/ep-step-windows-2026-11-28
export PYTHONPATH="$(pwd):$(pwd)/plugins/attention_triton/src:$(pwd)/plugins/attention_flash/src:$(pwd)/plugins/parallel_tp/src:$(pwd)/plugins/parallel_ep/src:$(pwd)/plugins/quant_w8a8/src:$(pwd)/plugins/spec_decode/src:${PYTHONPATH:-}"
CTX_LO=100 CTX_HI=1060 timeout 150 python $D/decode_splits_probe.py > $OUT/splits-100-1060.log 2>&1
echo "[splits] rc=$? at ${SECONDS}s"; cat $OUT/splits-100-1060.log | grep '^{' | python -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['batch'], r['heads'], r['kv_heads'], r['splits'], 'chosen', r['chosen'], r['us'])"
INFER_EXPERT_PARALLEL_SIZE=2 timeout 260 python $D/ep_windows.py ep2 > $OUT/win-ep2.log 2>&1
echo "[ep2] rc=$? at ${SECONDS}s"
timeout $(( 560 - SECONDS )) python $D/ep_windows.py single > $OUT/win-single.log 2>&1
echo "[single] rc=$? at ${SECONDS}s"
grep -E "^step breakdown|GPU busy|GPU idle|_decode_kernel|_moe_gemm|ncclDev|steps, " $OUT/win-ep2.log $OUT/win-single.log | cut -c1-150
