#!/usr/bin/env bash
# Issue 28's verify graphs (spec_decode GPU tests, the draft benchmark) and issue 29's grammar cost at batch 64.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/spec $OUT/grammar
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu plugins/spec_decode/tests > $OUT/spec/spec-gpu-tests.log 2>&1
echo "spec tests rc=$?: $(tail -1 $OUT/spec/spec-gpu-tests.log)"
timeout 200 python -m benchmarks.spec_draft --steps 10 --repeats 1 --out $OUT/spec > $OUT/spec/spec-draft.log 2>&1
echo "spec_draft rc=$?"; grep -vE "it/s\]|^\s*$|INFO" $OUT/spec/spec-draft.log | tail -14
timeout 250 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 0 --out $OUT/grammar > $OUT/grammar/grammar-overhead.log 2>&1
echo "grammar_overhead rc=$?"; grep -vE "it/s\]|^\s*$|INFO" $OUT/grammar/grammar-overhead.log | tail -10
