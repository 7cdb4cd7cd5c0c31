#!/usr/bin/env bash
# call G1 (2026-11-27): the FP8 KV device tests with the split-K context lengthened for the GPU (issue 26)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/kv
timeout 200 python -m pytest -q -p no:cacheprovider plugins/attention_triton/tests/test_kv_fp8.py > $OUT/kv/kv-fp8-tests.log 2>&1
echo "kv fp8 tests rc=$?: $(tail -1 $OUT/kv/kv-fp8-tests.log)"; grep -E "^FAILED|^E  " $OUT/kv/kv-fp8-tests.log | head -8
nvidia-smi --query-gpu=name --format=csv,noheader
