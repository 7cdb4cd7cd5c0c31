#!/usr/bin/env bash
# Issue 27 on two GPUs (main's code): the EP and TP GPU suites (the rank machinery moved into the core), then
# Qwen3-30B-A3B (dummy bf16) on one GPU, EP=2 (all-to-all and all-reduce dispatch) and TP=2, one process each.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${PART:-tests}" = tests ]; then
  timeout ${LIMIT:-300} python -m pytest -q -p no:cacheprovider -m gpu plugins/parallel_ep/tests plugins/parallel_tp/tests \
    > $OUT/ep-tp-gpu-tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error|error" $OUT/ep-tp-gpu-tests.log | tail -15
fi
if [ "${PART:-tests}" = bench ]; then
  timeout ${LIMIT:-500} python -m benchmarks.ep --only ${RUNS:-single,ep2,ep2-all-reduce,tp2} --num-prompts 128 --repeats 1 \
    --timeout 110 --out $OUT > $OUT/ep-bench.log 2>&1; echo "bench rc=$?"; grep -vE "it/s\]|s/it\]" $OUT/ep-bench.log | tail -30
fi
