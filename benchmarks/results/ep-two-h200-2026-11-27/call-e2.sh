# Issue 27 (session 2026-11-27f), call E2 on nvidia-h100-x2 (E1 got 2x H200): the whole Qwen3-30B-A3B (48 layers, dummy bf16) on one
# H100 against EP=2 (all_to_all, the default dispatch) and TP=2, nano-vllm's offline workload (its first 128 prompts),
# each in a fresh process, one after the other.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
DEADLINE=330
run() {  # name limit env... -- command...
  local name=$1 limit=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$(( DEADLINE - SECONDS )); local t=$(( left < limit ? left : limit ))
  if [ "$t" -lt 40 ]; then echo "[$name] skipped: $left s left"; return; fi
  env "${envs[@]}" timeout -s INT -k 15 "$t" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] rc=$? at ${SECONDS}s"
  grep -vE "it/s\]|s/it\]" "$OUT/$name.log" | grep -E "KV cache:|^infer |tok/s|ms/token|Error" | tail -4
}
THR=(python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 128 --timeout 130)
LAT=(python -m infer_core.cli bench latency --model Qwen3-30B-A3B --prompt-len 128 --new-tokens 128 --repeats 3 --timeout 70)
run thr-single 140 X=1 -- "${THR[@]}" --out "$OUT/single"
run thr-ep2 100 INFER_EXPERT_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/ep2"
run thr-tp2 90 INFER_TENSOR_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/tp2"
echo "done in $SECONDS s"
