#!/usr/bin/env bash
# The core branch's part of serve-25.sh alone, every log kept.
set -u
cd "$(dirname "$0")/.."
M=$PWD; W=$PWD/.wt/core; BASE_PP=$PYTHONPATH
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TMPDIR=$OUT
python -m benchmarks.word_tokenizer --vocab-size 151936 --out /tmp/word-tokenizer
BENCH="--endpoint completions --concurrency ${CONC:-1 16 64 256} --num-prompts 256 --input-len 512 --output-len 128 --no-progress"
FLAGS="--model $M/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer"
export PYTHONPATH="$W:$W/plugins/attention_triton/src:$W/plugins/attention_flash/src:$W/plugins/parallel_tp/src:$BASE_PP"
cd $W
timeout ${LIMIT:-240} python -m infer_core.cli bench serve --start-server "$FLAGS" --offline-row $BENCH \
  --label core-process --json $OUT/serve-25-core.json > $OUT/bench-core.log 2>&1
echo "rc=$?"
grep -v "httpx" $OUT/bench-core.log | tail -60
for f in $OUT/infer-bench-serve-*/serve.log; do echo "== $f"; grep -E "ready|ERROR|Error" $f | head -5; done
timeout 120 python -m pytest -q -p no:cacheprovider tests/server/test_lifecycle.py -k plain_uvicorn 2>&1 | tail -3
