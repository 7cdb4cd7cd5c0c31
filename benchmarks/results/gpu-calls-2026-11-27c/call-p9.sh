# Issue 26, call P9: where Qwen3-8B's offline steps go, bf16 against FP8 W8A8 + FP8 KV (nano-vllm workload, dummy
# weights, infer bench throughput --profile): a window of 6 steps past the prefills (decode near 256 rows) and the
# first 2 steps (prefill), each run's top kernels.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # name skip steps env...
  local name=$1 skip=$2 steps=$3; shift 3
  env "$@" timeout 140 python -m infer_core.cli bench throughput --model Qwen3-8B --load-format dummy --workload nano-vllm \
     --profile --profile-skip $skip --profile-steps $steps --out $OUT/$name > $OUT/$name.log 2>&1
  echo "$name rc=$?"
}
run bf16-decode 40 6
run fp8kv-decode 40 6 INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
run bf16-prefill 0 2
run fp8kv-prefill 0 2 INFER_QUANTIZATION=fp8 INFER_KV_CACHE_DTYPE=fp8
python - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*/offline-throughput-*.json")):
    rows = json.load(open(f))["results"]
    for r in rows:
        b = r.get("step_breakdown")
        if not b: continue
        print("==", f.split("/")[-2], r.get("output_tok_s"))
        print(json.dumps({k: v for k, v in b.items() if k != "top_kernels"})[:600])
        for k in b.get("top_kernels", [])[:12]: print("  ", json.dumps(k)[:200])
PY
