# Issue 26, call P3: the Triton decode kernel over an FP8 cache with float16 dots, its tiles swept against a
# bfloat16 cache and flash-attn (benchmarks/kv_fp8_decode_sweep.py), and the attention plugin's GPU tests.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
(cd plugins/attention_triton && timeout 200 python -m pytest -q -m gpu tests -p no:cacheprovider -rfE > $OUT/triton-gpu-tests.log 2>&1; tail -3 $OUT/triton-gpu-tests.log)
timeout 300 python -m benchmarks.kv_fp8_decode_sweep --out $OUT/sweep.json > $OUT/sweep.log 2>&1
python - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sweep.json"))
for cell in dict.fromkeys(r["cell"] for r in rows):
    rs = [r for r in rows if r["cell"] == cell]
    for r in rs[:5]: print(cell, r)
    best = sorted((r for r in rs if r["system"] == "fp8"), key=lambda r: r["time_us"])[:4]
    for r in best: print(cell, "best", r)
PY
tail -3 $OUT/sweep.log
