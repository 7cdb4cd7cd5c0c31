#!/usr/bin/env bash
# call M6: the sampling kernel's pass A gives -inf bounds to -inf logits (grammar-masked slices are skipped):
# the masked-rows check interpreted (this host's CPU) and on CUDA, every fused-sampling GPU test, then the grammar
# cost at batch 64 of this tree and of the base tree (1c81212) on the same machine
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
BASEPATH=$PWD/.wt/base$(for p in .wt/base/plugins/*/src; do printf ":$PWD/$p"; done)
mkdir -p $OUT/new $OUT/base
CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 timeout 200 python -W ignore tests/sampling/fused_checks.py masked_rows 2 5000 > $OUT/new/interpreted.log 2>&1
echo "interpreted masked_rows rc=$?: $(tail -1 $OUT/new/interpreted.log)"
timeout 300 python -m pytest -q -p no:cacheprovider tests/sampling/test_fused_gpu.py tests/fused/test_token_bitmask.py > $OUT/new/sampling-gpu-tests.log 2>&1
echo "sampling GPU tests rc=$?: $(tail -1 $OUT/new/sampling-gpu-tests.log)"; grep -E "^FAILED|^E " $OUT/new/sampling-gpu-tests.log | head -6
timeout 200 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 0 --out $OUT/new > $OUT/new/grammar-overhead.log 2>&1
echo "new grammar_overhead rc=$?"; grep -E "tok/s \(runs" $OUT/new/grammar-overhead.log
(cd .wt/base && PYTHONPATH=$BASEPATH:$PYTHONPATH timeout 150 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 0 --out $OUT/base > $OUT/base/grammar-overhead.log 2>&1
 echo "base grammar_overhead rc=$?"; grep -E "tok/s \(runs" $OUT/base/grammar-overhead.log)
