# Issue 27 (session 2026-11-27f), call M2: the MoE kernel benchmark (main's kernels; M1's persistent gate_up reverted)
# with L2 emptied before each replay by writing 256 MiB (as before: the replay writes those dirty lines back) and by
# reading 256 MiB (clean lines, as in a decode step), write once, read twice.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
for run in write-1 read-1 read-2; do
  timeout 70 python -m benchmarks.moe_kernel --tokens 1,2,16 --l2-flush ${run%-*} --out $OUT/$run > $OUT/$run.log 2>&1
  echo "$run rc=$?"; grep -E "^(qwen3|mixtral)" $OUT/$run.log
done
