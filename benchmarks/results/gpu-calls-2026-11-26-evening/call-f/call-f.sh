#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/kv $OUT/grammar
timeout 150 python -m pytest -q -p no:cacheprovider plugins/attention_triton/tests/test_kv_fp8.py > $OUT/kv/kv-fp8-tests.log 2>&1
echo "kv fp8 tests rc=$?: $(tail -1 $OUT/kv/kv-fp8-tests.log)"; grep -E "^FAILED|^E  " $OUT/kv/kv-fp8-tests.log | head -5
timeout 280 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 0 --out $OUT/grammar > $OUT/grammar/grammar-overhead.log 2>&1
echo "grammar_overhead rc=$?"; grep -vE "it/s\]|^\s*$|INFO" $OUT/grammar/grammar-overhead.log | tail -10
