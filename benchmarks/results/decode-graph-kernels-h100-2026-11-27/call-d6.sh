# Session 2026-11-27g, call D6 on nvidia-h100-x1: flash (the GPU default) against triton on the README's workloads,
# Qwen3-0.6B dummy bf16, main: offline (nano-vllm's workload), batch-1 decode, and the server at concurrency 256
# (512 in / 128 out, with its offline row). D2/D4: on Qwen3-30B-A3B batch-1 flash was 16-24% slower (its split-KV
# combine kernel); is there a workload where flash is the faster default?
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 150 python -m infer_core.cli bench throughput --model Qwen3-0.6B --attention flash triton --out $OUT/offline \
  > $OUT/offline.log 2>&1; echo "offline rc=$? at ${SECONDS}s"; grep -E "^(infer|system) " $OUT/offline.log
timeout 120 python -m infer_core.cli bench latency --model Qwen3-0.6B --attention flash triton --out $OUT/latency \
  > $OUT/latency.log 2>&1; echo "latency rc=$? at ${SECONDS}s"; grep -E "^(infer|system) " $OUT/latency.log
export TMPDIR=$OUT
python benchmarks/word_tokenizer.py --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
serve() {  # label attention
  timeout 150 python -m infer_core.cli bench serve --start-server "--model $(pwd)/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer --attention $2" \
    --offline-row --concurrency 256 --endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress \
    --label $1 --json $OUT/serve-$1.json > $OUT/serve-$1.log 2>&1
  echo "serve $1 rc=$? at ${SECONDS}s"
  grep -v httpx $OUT/serve-$1.log | grep -E "output throughput|TTFT|of offline" | tail -5
}
serve flash flash
serve triton triton
cd $OUT && tar czf json.tgz $(find . -name "*.json") && find . -name "*.json" -delete; echo "end at ${SECONDS}s"
