#!/usr/bin/env bash
# Issue 27 on two H100s (nvidia-h100-x2), from the repo root after `source .device/setup.sh`; JSON and logs under $OUT.
#
# PART=tests: the EP plugin's GPU suite: EP=2 against one GPU in float32, Qwen3-MoE and Mixtral, both dispatches;
#   with all_to_all, eager steps run on token slices (reduce-scatter, all-to-all, all-gather over NCCL) and decode
#   steps replay CUDA graphs captured on the all-reduce path.
# PART=bench: `infer bench throughput` (nano-vllm's workload, its first $PROMPTS prompts) and `infer bench latency`
#   (batch 1, 128-token prompt, 128 new tokens) on Qwen3-30B-A3B cut to 24 of its 48 layers (dummy bf16, ~31 GB:
#   the real layer shapes, 128 experts, top-8, H=2048, I=768, with room for KV on one H100; the whole model's
#   61 GB leaves one H100 254 KV blocks), on one GPU, EP=2 (all_reduce, the default), EP=2 all_to_all and TP=2;
#   batch-1 decode on one GPU and EP=2 (whose decode steps replay graphs of the all_reduce path), then TP=2.
#   Last, if time is left: `infer bench throughput` on the whole Qwen3-30B-A3B on one GPU, the run that failed
#   with "the timed run found its prompts in the prefix cache" (its small KV cache preempts requests).
# PART=all (default): both, under 8 minutes (DEADLINE=455 s; tests alone 165 s, bench alone 290 s); each command is
#   cut at its own limit or the deadline, and the bench's last ones are skipped when too little time is left.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/ep-27b}
mkdir -p "$OUT"
PART=${PART:-all}
case "$PART" in tests) default=165 ;; bench) default=290 ;; *) default=455 ;; esac
DEADLINE=${DEADLINE:-$default}  # seconds from the start for everything this call runs
PROMPTS=${PROMPTS:-64}
unset INFER_EXPERT_PARALLEL_SIZE INFER_TENSOR_PARALLEL_SIZE INFER_EXPERT_PARALLEL_DISPATCH INFER_PARALLEL
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

left() { echo $(( DEADLINE - SECONDS )); }
# run NAME LIMIT ENV... -- COMMAND...: cut at LIMIT seconds or the deadline, whichever comes first
run() {
  local name=$1 limit=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t=$(( $(left) < limit ? $(left) : limit ))
  if [ "$t" -lt 30 ]; then echo "[$name] skipped: $(left) s left"; return; fi
  local start=$SECONDS
  # SIGINT: the bench parent then kills its system process group (engine and ranks), pytest prints its summary
  env "${envs[@]}" timeout -s INT -k 15 "$t" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] rc=$? in $(( SECONDS - start )) s (limit $t)"
  grep -vE "it/s\]|s/it\]" "$OUT/$name.log" | grep -E "passed|failed|Error|error|tok/s|ms/token|infer |wrote|^\|" | tail -12
}

if [ "$PART" = tests ] || [ "$PART" = all ]; then
  run ep-gpu-tests 165 X=1 -- python -m pytest -v -p no:cacheprovider --durations=0 -m gpu plugins/parallel_ep/tests
fi

if [ "$PART" = bench ] || [ "$PART" = all ]; then
  MODEL=/tmp/Qwen3-30B-A3B-24L
  python - "$MODEL" <<'EOF'
import json, sys
from pathlib import Path
config = json.loads(Path("benchmarks/configs/Qwen3-30B-A3B/config.json").read_text())
config["num_hidden_layers"] = 24
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / "config.json").write_text(json.dumps(config, indent=1))
EOF
  THR=(python -m infer_core.cli bench throughput --model "$MODEL" --num-prompts "$PROMPTS" --timeout 100)
  LAT=(python -m infer_core.cli bench latency --model "$MODEL" --prompt-len 128 --new-tokens 128 --repeats 3 --timeout 70)
  # in order of need: what the deadline cuts is the end of the list
  run thr-single 100 X=1 -- "${THR[@]}" --out "$OUT/single"
  run thr-ep2 100 INFER_EXPERT_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/ep2"
  run thr-ep2-all-to-all 100 INFER_EXPERT_PARALLEL_SIZE=2 INFER_EXPERT_PARALLEL_DISPATCH=all_to_all -- \
    "${THR[@]}" --out "$OUT/ep2-all-to-all"
  run thr-tp2 100 INFER_TENSOR_PARALLEL_SIZE=2 -- "${THR[@]}" --out "$OUT/tp2"
  run lat-single 75 X=1 -- "${LAT[@]}" --out "$OUT/single"
  run lat-ep2 75 INFER_EXPERT_PARALLEL_SIZE=2 -- "${LAT[@]}" --out "$OUT/ep2"
  run thr-single-48l 130 X=1 -- python -m infer_core.cli bench throughput --model Qwen3-30B-A3B --num-prompts 32 \
    --timeout 120 --out "$OUT/single-48l"
  run lat-tp2 75 INFER_TENSOR_PARALLEL_SIZE=2 -- "${LAT[@]}" --out "$OUT/tp2"
fi
echo "done in $SECONDS s; JSON:"
find "$OUT" -name "*.json" | sort
