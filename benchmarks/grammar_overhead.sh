#!/usr/bin/env bash
# Issue 29 on one H100, from the repository root after `source .device/setup.sh` (.device/whl must carry
# xgrammar-0.2.8 and apache-tvm-ffi, from the req worktree's .device/whl): the structured-output GPU tests
# (the grammar-mask kernel at Qwen's vocabulary, constrained and free rows in CUDA-graph batches, prompt
# logprobs on CUDA, the kernel against the torch path), then the grammar's cost at batch 64 (a JSON schema on
# every request against none, temperature 1 and 0; the bar is at most 10% fewer output tok/s), then batch-1
# decode of the free path (it must not move: main's figure is about 0.89 ms/token on Qwen3-0.6B).
# Everything it writes goes under $OUT: logs, and the benchmark's JSON (grammar-overhead-*.json, bench latency's).
set -u
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import xgrammar, triton, torch; print('xgrammar ok; torch', torch.__version__)" || echo "xgrammar missing: the grammar tests and benchmark cannot run"
timeout 240 python -m pytest -q -p no:cacheprovider tests/test_structured_gpu.py tests/fused/test_token_bitmask.py \
  tests/sampling/test_bitmask.py > $OUT/structured-gpu-tests.log 2>&1
echo "structured GPU tests rc=$?"; grep -E "passed|failed|skipped|^FAILED|^E " $OUT/structured-gpu-tests.log | tail -12
timeout 420 python -m benchmarks.grammar_overhead --repeats 3 --temperature 1.0 0 --out $OUT \
  > $OUT/grammar-overhead.log 2>&1
echo "grammar_overhead rc=$?"; grep -E "tok/s|within_10pct|Error|error" $OUT/grammar-overhead.log | tail -10
timeout 120 python -m infer_core.cli bench latency --repeats 3 --out $OUT/latency > $OUT/latency.log 2>&1
echo "bench latency rc=$?: $(grep -E '^--- infer' $OUT/latency.log | head -1)"
