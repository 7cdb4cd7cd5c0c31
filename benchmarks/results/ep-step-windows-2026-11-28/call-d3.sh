# Call D3 (2 GPUs): EP=2's prefill steps with piecewise graphs are as slow as eager (D2a): the prefill window's
# Chrome trace on rank 0 (host ranges and launches), this tree.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
D=benchmarks/results/ep-step-windows-2026-11-28
export PYTHONPATH="$(pwd):$(pwd)/plugins/attention_triton/src:$(pwd)/plugins/attention_flash/src:$(pwd)/plugins/parallel_tp/src:$(pwd)/plugins/parallel_ep/src:$(pwd)/plugins/quant_w8a8/src:$(pwd)/plugins/spec_decode/src:${PYTHONPATH:-}"
mkdir -p $OUT/trace
TRACE_DIR=$OUT/trace PREFILL_ONLY=1 INFER_EXPERT_PARALLEL_SIZE=2 timeout 240 python $D/ep_windows.py ep2pw > $OUT/win-ep2pw.log 2>&1
echo "[ep2] rc=$? at ${SECONDS}s"; sed -n '/step breakdown/,/^step breakdown, .*decode/p' $OUT/win-ep2pw.log | head -30
cd $OUT/trace && gzip -9 *.json; ls -la $OUT/trace
