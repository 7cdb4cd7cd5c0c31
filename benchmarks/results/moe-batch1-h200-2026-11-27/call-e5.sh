# Session 2026-11-27h, call E5 on nvidia-h200: the GPU tests of what main now runs (E4's g2 tiles committed): the MoE
# kernels and models, the norm + GEMV launch (which may now store the normed rows), and the last session's unrun D10
# list (speculative decoding's draft warm-up, flash's renamed block-size test); triton's ran in E4 (66 passed).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
t() {  # name, then pytest arguments
  local name=$1; shift
  timeout $((585 - SECONDS)) python -m pytest -q -p no:cacheprovider -m gpu "$@" -rfE > $OUT/$name.log 2>&1
  echo "$name rc=$? at ${SECONDS}s: $(tail -1 $OUT/$name.log)"
}
t moe tests/fused/test_moe_gpu.py plugins/parallel_ep/tests/test_gpu.py
t parity tests/test_hf_parity.py -k "moe or mixtral"
t norm-gemv tests/fused/test_norm_gemv_gpu.py
t spec plugins/spec_decode/tests/test_gpu.py
t flash plugins/attention_flash/tests/test_engine_gpu.py
echo "end at ${SECONDS}s"
