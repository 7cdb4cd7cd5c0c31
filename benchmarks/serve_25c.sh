#!/usr/bin/env bash
# Issue 25, serving at the engine's speed, for one code tree on one H100 (run it once per tree):
#   1. the acceptance run: `infer bench serve` at concurrency 1 16 64 256, 256 prompts of 512 random token ids,
#      128 tokens out, with the offline engine on the same prompts (--offline-row);
#   2. where the CPU goes (benchmarks/serve_overhead.py, this branch's copy, measuring the tree's code): CPU time
#      of the server's process, the engine core's and the load generator's, per output token, at 64 and 256.
# Usage, from any checkout with .device/setup.sh sourced:  OUT=... bash benchmarks/serve_25c.sh [TREE] [TAG]
#   TREE: the code to measure (default: the repo this script is in); TAG names the files (default: TREE's name).
# Writes $OUT/serve-25c-TAG.json (bench record), $OUT/serve-25c-overhead-TAG.json, and their logs.
# Each tree takes about 5-8 minutes (two server starts with the model's dummy weights, one offline engine).
set -u
HERE="$(cd "$(dirname "$0")/.." && pwd)"
TREE="$(cd "${1:-$HERE}" && pwd)"
TAG="${2:-$(basename "$TREE")}"
: "${OUT:?set OUT to the folder for the results}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TMPDIR=$OUT
export PYTHONPATH="$TREE:$TREE/plugins/attention_triton/src:$TREE/plugins/attention_flash/src:$TREE/plugins/parallel_tp/src${PYTHONPATH:+:$PYTHONPATH}"
cd "$TREE"
[ -f /tmp/word-tokenizer/tokenizer.json ] || python "$HERE/benchmarks/word_tokenizer.py" --vocab-size 151936 --out /tmp/word-tokenizer
python -c "import infer_core, sys; print('measuring', infer_core.__file__, 'python', sys.version.split()[0])"
python -c "import uvloop" 2>/dev/null && echo "uvloop: installed" || echo "uvloop: absent"
python -c "import httptools" 2>/dev/null && echo "httptools: installed (uvicorn parses HTTP in C)" || echo "httptools: absent (uvicorn uses h11)"
FLAGS="--model $TREE/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer"
LOAD="--endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress"
timeout "${LIMIT:-300}" python -m infer_core.cli bench serve --start-server "$FLAGS" --offline-row \
  --concurrency 1 16 64 256 $LOAD --label "$TAG" --json "$OUT/serve-25c-$TAG.json" > "$OUT/bench-$TAG.log" 2>&1
echo "bench rc=$?"
grep -v httpx "$OUT/bench-$TAG.log" | tail -30
timeout "${LIMIT_OVERHEAD:-240}" python "$HERE/benchmarks/serve_overhead.py" --start-server "$FLAGS" \
  --concurrency 64 256 $LOAD --json "$OUT/serve-25c-overhead-$TAG.json" > "$OUT/overhead-$TAG.log" 2>&1
echo "overhead rc=$?"
grep -v httpx "$OUT/overhead-$TAG.log" | tail -6
