# Final checks of this session's GPU changes: the W8A8 plugin's tests (all) and the Triton attention plugin's GPU
# tests (all), on the tree as committed.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
(cd plugins/quant_w8a8 && timeout 150 python -m pytest -q tests -p no:cacheprovider -rfEs > $OUT/quant-tests.log 2>&1; tail -3 $OUT/quant-tests.log)
(cd plugins/attention_triton && timeout 400 python -m pytest -q -m gpu tests -p no:cacheprovider -rfE > $OUT/triton-gpu-tests.log 2>&1; tail -3 $OUT/triton-gpu-tests.log)
