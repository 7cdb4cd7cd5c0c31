#!/usr/bin/env bash
# call M2: where a constrained batch-64 step's host time goes (cProfile of one JSON and one free run), then
# issue 26's Qwen3-8B offline rows (bf16, FP8 W8A8, FP8 W8A8 + FP8 KV)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/prof
timeout 150 python -m benchmarks.grammar_overhead --repeats 1 --temperature 1.0 --no-write --profile $OUT/prof/grammar-cprofile.txt > $OUT/prof/grammar-overhead.log 2>&1
echo "profile rc=$?"; grep -E "tok/s" $OUT/prof/grammar-overhead.log; grep -E "^===" $OUT/prof/grammar-cprofile.txt
bash benchmarks/quant_26c.sh
