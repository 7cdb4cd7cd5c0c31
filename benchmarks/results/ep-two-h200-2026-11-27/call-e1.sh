# Issue 27 (session 2026-11-27f), call E1 on nvidia-h100-x2: the whole Qwen3-30B-A3B (48 layers, dummy bf16) on one
# H100 against EP=2 (all_to_all, the default dispatch) and TP=2, nano-vllm's offline workload (its first 128 prompts),
# each in a fresh process, one after the other; then, time allowing, batch-1 decode for one GPU and EP=2.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
DEADLINE=540
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
THR=(python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 128 --timeout 150)
LAT=(python -m infer_core.cli bench latency --model Qwen3-30B-A3B --prompt-len 128 --new-tokens 128 --repeats 3 --timeout 70)
run thr-single 170 X=1 -- "${THR[@]}" --out "$OUT/single"
run thr-ep2 170 INFER_EXPERT_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/ep2"
run thr-tp2 170 INFER_TENSOR_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/tp2"
run lat-ep2 80 INFER_EXPERT_PARALLEL_SIZE=2 -- "${LAT[@]}" --out "$OUT/ep2"
echo "done in $SECONDS s"
