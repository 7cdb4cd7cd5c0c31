# Call T4 (2 GPUs): the EP GPU test that now asserts a padded piecewise replay ran, then the tile sweep at
# Mixtral-8x7B's shapes (the table was chosen at Qwen3-30B-A3B's).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:${PYTHONPATH:-}"; }
export PYTHONPATH="$(tree_path $HERE)"
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu plugins/parallel_ep/tests/test_gpu.py -k piecewise -rfE > $OUT/gpu-tests.log 2>&1; echo "[gpu tests] rc=$? at ${SECONDS}s"; tail -3 $OUT/gpu-tests.log
timeout 200 python benchmarks/results/ep-rank-tiles-2026-11-28/tiles_probe.py $OUT/tiles-mixtral.json mixtral 2>&1 | tee $OUT/tiles-mixtral.log
echo "done in $SECONDS s"
