#!/usr/bin/env bash
# A/B of the CPU prefill budget at concurrency 32 (bf16), alternated
cd /work/main && source .venv/bin/activate
OUT=/tmp/ab-budget; mkdir -p $OUT
for round in 1 2; do
for budget in 2048 512 1024; do
  echo "=== round $round budget $budget $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd /tmp && INFER_MAX_NUM_BATCHED_TOKENS=$budget PYTHONPATH=/work/main exec python -m infer_core.cli serve --model /work/research/smollm2-st --dtype bfloat16 --port 8421) > $OUT/server-$round-$budget.log 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8421/health >/dev/null && break; sleep 1; done
  python -m infer_core.cli bench serve --base-url http://127.0.0.1:8421 --endpoint completions --input-len 512 --output-len 128 --no-progress --num-prompts 8 --concurrency 8 > /dev/null 2>&1  # warm-up
  python -m infer_core.cli bench serve --base-url http://127.0.0.1:8421 --endpoint completions --input-len 512 --output-len 128 --no-progress --num-prompts 32 --concurrency 32 --label b$budget --json $OUT/r$round-b$budget.json > $OUT/bench-$round-$budget.log 2>&1
  grep -E "output throughput|TTFT \(ms\)|ITL" $OUT/bench-$round-$budget.log
  kill $pid; wait $pid 2>/dev/null
done
done
