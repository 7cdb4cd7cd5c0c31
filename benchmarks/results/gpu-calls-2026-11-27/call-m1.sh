#!/usr/bin/env bash
# call M1 (2026-11-27): issue 29 after the grammar merge (tests, grammar cost at batch 64 beside the base tree),
# and batch-1 decode of both trees (the free path must not move)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
BASEPATH=$PWD/.wt/base$(for p in .wt/base/plugins/*/src; do printf ":$PWD/$p"; done)
mkdir -p $OUT/new $OUT/base
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_structured_gpu.py tests/fused/test_token_bitmask.py \
  tests/sampling/test_bitmask.py tests/test_grammar_batch.py > $OUT/new/structured-gpu-tests.log 2>&1
echo "structured GPU tests rc=$?: $(tail -1 $OUT/new/structured-gpu-tests.log)"; grep -E "^FAILED|^E " $OUT/new/structured-gpu-tests.log | head -6
timeout 200 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 0 --out $OUT/new > $OUT/new/grammar-overhead.log 2>&1
echo "new grammar_overhead rc=$?"; grep -E "tok/s \(runs" $OUT/new/grammar-overhead.log
(cd .wt/base && PYTHONPATH=$BASEPATH:$PYTHONPATH timeout 120 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 --out $OUT/base > $OUT/base/grammar-overhead.log 2>&1
 echo "base grammar_overhead rc=$?"; grep -E "tok/s \(runs" $OUT/base/grammar-overhead.log)
for tree in new base; do
  if [ $tree = base ]; then cd .wt/base; export PYTHONPATH=$BASEPATH:$PYTHONPATH; fi
  timeout 90 python -m infer_core.cli bench latency --repeats 3 --out $OUT/$tree > $OUT/$tree/latency.log 2>&1
  echo "$tree bench latency rc=$?: $(grep -E '^infer ' $OUT/$tree/latency.log | head -2 | tr -s ' ')"
done
