# Issue 26 (session 2026-11-27d), call Q7: where the GPU idles in Qwen3-8B's offline decode steps near 256 rows
# (call P9: 1.9 ms a step with FP8 W8A8 + FP8 KV, 1.6 with bf16). Chrome traces of 3 profiled steps past the
# first 40, gzipped, for the host's calls during the GPU's gaps.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # name env...
  local name=$1; shift
  mkdir -p $OUT/$name-trace
  env "$@" timeout 150 python -m infer_core.cli bench throughput --model Qwen3-8B --load-format dummy --workload nano-vllm \
     --profile --profile-skip 40 --profile-steps 3 --trace $OUT/$name-trace --out $OUT/$name > $OUT/$name.log 2>&1
  echo "$name rc=$?"; grep -E "^infer " $OUT/$name.log
  for f in $OUT/$name-trace/*.json; do gzip -9 "$f"; mv "$f.gz" $OUT/$name-trace.json.gz; done; rmdir $OUT/$name-trace
  ls -la $OUT/$name-trace.json.gz
}
run fp8kv INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
run bf16
