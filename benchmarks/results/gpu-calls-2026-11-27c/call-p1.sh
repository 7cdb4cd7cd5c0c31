# Issues 26 and 29 (session 2026-11-27c), call P1: the quant plugin's tests on the GPU (one-launch activation
# quantization with the reciprocal scale), the structured-output GPU tests, then the grammar benchmarks: this tree
# (the model config given the tokenizer's end token), with SmolLM2's real tokenizer, and the base tree's as it was.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HERE=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
(cd plugins/quant_w8a8 && timeout 240 python -m pytest -q tests -p no:cacheprovider -rfE > $OUT/quant-tests.log 2>&1; tail -3 $OUT/quant-tests.log)
timeout 120 python -m pytest -q -m gpu tests/test_structured_gpu.py tests/test_grammar_batch.py tests/fused/test_token_bitmask.py -p no:cacheprovider > $OUT/structured-tests.log 2>&1; tail -2 $OUT/structured-tests.log
timeout 150 python -m benchmarks.grammar_overhead --repeats 2 --out $OUT/g-this > $OUT/g-this.log 2>&1; grep -E '^\{|tok/s' $OUT/g-this.log | grep -v INFO
timeout 120 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 --tokenizer .device/smol-tok --out $OUT/g-smol > $OUT/g-smol.log 2>&1; grep -E '^\{' $OUT/g-smol.log
timeout 120 python -m benchmarks.grammar_accept_probe --out $OUT/probe.json > $OUT/probe.log 2>&1; grep -E '^\{' $OUT/probe.log | cut -c1-420
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
(cd .wt/base && PYTHONPATH=$(tree_path $HERE/.wt/base) timeout 120 python -m benchmarks.grammar_overhead --repeats 2 --temperature 1.0 --out $OUT/g-base > $OUT/g-base.log 2>&1; grep -E '^\{' $OUT/g-base.log)
