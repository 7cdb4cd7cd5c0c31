# Issue 26, call P7: the long-context workload with every kernel compiled before the timed runs: benchmarks/kv_fp8.py
# twice (bf16 KV on the default backend, FP8 KV on triton, bf16 KV on triton); the second pass is the figure (P6
# showed a first run on a tree paying Triton's compiles inside its timed batch).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
for pass in 1 2; do
  timeout 200 python -m benchmarks.kv_fp8 --rows auto:auto fp8:triton auto:triton --out $OUT/pass-$pass > $OUT/pass-$pass.log 2>&1
  echo "pass $pass:"; grep -E 'flash: |triton: ' $OUT/pass-$pass.log | tr -s ' '
done
