#!/bin/bash
# Issue 30 on e6cd554 (no CPU code change since 096a311): the two bfloat16 cells behind last time. Offline infer then
# vLLM (both cores), three rounds; then the serving comparison, bfloat16 only, three runs.
cd /tmp && . /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1 PYTHONPATH=/work/main
D=/work/runs/peer5
echo -20 > /proc/self/autogroup 2>/dev/null
git -C /work/main log --oneline -1 > $D/tree.txt
for run in 1-bfloat16 2-bfloat16 3-bfloat16; do
  dtype=${run#*-}
  echo "$run start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/uptime.log
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 python -m infer_core.cli bench throughput --model /work/research/smollm2-st --load-format auto \
    --workload chat --dtype $dtype --peers vllm --peer-python /work/research/vllm-cpu/bin/python \
    --out $D/offline/$run > $D/offline-$run.log 2>&1
  echo "$run done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/uptime.log
done
cd /work/main && MODEL=/work/research/smollm2-st VLLM_VENV=/work/research/vllm-cpu OUT=$D/serve RUNS=3 DTYPES=bfloat16 \
  bash benchmarks/cpu_serve_peer.sh > $D/serve.log 2>&1
echo "serve done $(date -u +%H:%M:%S)" >> $D/uptime.log
