#!/usr/bin/env bash
# Issue 30, serving half: `infer serve` against vLLM's CPU server (its default: one core computes, one serves),
# same model folder (SmolLM2-135M-Instruct in safetensors), same token ids (random ids, --input-len 512), 128 out,
# at concurrency 1 (8 requests), 8 and 32 (32 requests each); per dtype, runs alternated, load average logged.
# vLLM's KV cache gets 4 GiB (VLLM_CPU_KVCACHE_SPACE; its own default asks for most of the memory and fails to
# start when other processes hold some).
# Usage: MODEL=/path/to/smollm2-st VLLM_VENV=/path/to/venv OUT=dir RUNS=2 [DTYPES=bfloat16] bash benchmarks/cpu_serve_peer.sh
set -u
: "${MODEL:?}" "${VLLM_VENV:?}" "${OUT:?}"
RUNS=${RUNS:-2}
DTYPES=${DTYPES:-"bfloat16 float32"}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
echo -20 > /proc/self/autogroup 2>/dev/null && echo "autogroup nice -20" || echo "autogroup nice unchanged"
LOAD="--endpoint completions --input-len 512 --output-len 128 --no-progress"
bench() {  # label port
  local label=$1 port=$2
  python -m infer_core.cli bench serve --base-url http://127.0.0.1:$port $LOAD --num-prompts 8 --concurrency 1 \
    --label "$label" --json "$OUT/$label.json" > "$OUT/$label-c1.log" 2>&1
  python -m infer_core.cli bench serve --base-url http://127.0.0.1:$port $LOAD --num-prompts 32 --concurrency 8 32 \
    --label "$label" --json "$OUT/$label.json" --append > "$OUT/$label-c8-32.log" 2>&1
  grep -h -E "^==|output throughput|TTFT \(ms\)" "$OUT/$label-c1.log" "$OUT/$label-c8-32.log"
}
wait_ready() {  # port pid
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
for run in $(seq "$RUNS"); do
  for dtype in $DTYPES; do
    echo "=== run $run $dtype, $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd /tmp && exec python -m infer_core.cli serve --model "$MODEL" --dtype $dtype --port 8411) > "$OUT/infer-$run-$dtype-server.log" 2>&1 &
    pid=$!; start=$(date +%s.%N)
    wait_ready 8411 $pid && echo "infer ready after $(echo "$(date +%s.%N) - $start" | bc) s" && bench "infer-$run-$dtype" 8411
    kill $pid; wait $pid 2>/dev/null
    echo "--- vllm, load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd /tmp && VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4} exec "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" --dtype $dtype --port 8412) > "$OUT/vllm-$run-$dtype-server.log" 2>&1 &
    pid=$!; start=$(date +%s.%N)
    wait_ready 8412 $pid && echo "vllm ready after $(echo "$(date +%s.%N) - $start" | bc) s" && bench "vllm-$run-$dtype" 8412
    kill $pid; wait $pid 2>/dev/null
    sleep 3
  done
done
echo "=== done $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
