#!/usr/bin/env bash
# Issue 25 on one H100: main's server, then the core branch's (engine core in its own process) with the
# offline engine on the same prompts; the branch's bench client measures both. Qwen3-0.6B shape, dummy weights.
set -u
cd "$(dirname "$0")/.."
M=$PWD; W=$PWD/.wt/core; BASE_PP=$PYTHONPATH
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
BENCH="--endpoint completions --concurrency 1 16 64 256 --num-prompts 256 --input-len 512 --output-len 128 --no-progress"
python -m benchmarks.word_tokenizer --vocab-size 151936 --out /tmp/word-tokenizer
FLAGS="--model $M/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer"
# main's server (the code before the change), started by hand
PYTHONPATH="$M:$M/plugins/attention_triton/src:$M/plugins/attention_flash/src:$M/plugins/parallel_tp/src:$BASE_PP" \
  python -m infer_core.cli serve $FLAGS --port 8011 > $OUT/serve-main.log 2>&1 &
SP=$!
export PYTHONPATH="$W:$W/plugins/attention_triton/src:$W/plugins/attention_flash/src:$W/plugins/parallel_tp/src:$BASE_PP"
cd $W
timeout 200 python -m infer_core.cli bench serve --base-url http://127.0.0.1:8011 --wait-ready 150 $BENCH \
  --label main --json $OUT/serve-25.json 2>&1 | tail -25
kill $SP; wait $SP 2>/dev/null
timeout 300 python -m infer_core.cli bench serve --start-server "$FLAGS" --offline-row $BENCH \
  --label core-process --json $OUT/serve-25.json --append 2>&1 | tail -40
