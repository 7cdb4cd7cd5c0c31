# Issue 27, call P1 (2 GPUs): where an EP=2 offline step goes. Qwen3-30B-A3B (dummy bf16), nano-vllm's first 128
# prompts, each configuration in a fresh process; the measured run, then the workload again with steps 3-8 under
# torch.profiler (two 16384-token prefills, the 6060-token one, three decode steps at batch 128), traces kept.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
DEADLINE=${DEADLINE:-560}
run() {  # name limit env... -- command...
  local name=$1 limit=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$(( DEADLINE - SECONDS )); local t=$(( left < limit ? left : limit ))
  if [ "$t" -lt 40 ]; then echo "[$name] skipped: $left s left"; return; fi
  env "${envs[@]}" timeout -s INT -k 15 "$t" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] rc=$? at ${SECONDS}s"
  grep -vE "it/s\]|s/it\]" "$OUT/$name.log" | grep -E "^  (prefill|decode)|tok/s|Error" | tail -7
}
THR=(python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 128 --timeout 200
     --profile --profile-skip 3 --profile-steps 6)
run thr-ep2 170 INFER_EXPERT_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/ep2" --trace "$OUT/ep2"
run thr-ep2-ar 170 INFER_EXPERT_PARALLEL_SIZE=2 INFER_EXPERT_PARALLEL_DISPATCH=all_reduce -- "${THR[@]}" --out "$OUT/ep2-ar" --trace "$OUT/ep2-ar"
run thr-single 170 X=1 -- "${THR[@]}" --out "$OUT/single" --trace "$OUT/single"
cd $OUT && for d in ep2 ep2-ar single; do [ -d $d ] && tar czf $d.tgz $d && rm -rf $d; done; ls -la $OUT
echo "done in $SECONDS s"
