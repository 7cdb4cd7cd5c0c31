#!/usr/bin/env bash
# Issue 25, serving at the engine's speed, on one H100: this tree, then optionally a base tree beside it.
#   1. the acceptance run: `infer bench serve` at concurrency 1 16 64 256, 256 prompts of 512 random token ids,
#      128 tokens out, with the offline engine on the same prompts (--offline-row); every load point and the offline
#      row print the engine core's step timeline ("core steps" / "core time": steps by prefill/decode, tokens and
#      ms per step, time sending outputs, idle time), also in the JSON record (key core_timeline);
#   2. where the CPU goes (benchmarks/serve_overhead.py): CPU of the server's process (its event loop's share), of
#      the engine core's and of the client's, per output token and per streamed event, at 64 and 256, with the
#      step timeline;
#   3. with BASE (a checkout of main before this branch, e.g. .wt/base): step 2 for its server and its client (the
#      same HTTP reader as this tree's; its server serves no step timeline), so the two servers' CPU per token and
#      per event compare on one machine in one call.
# Usage, from the repo root with .device/setup.sh sourced:  OUT=... bash benchmarks/serve_25d.sh [BASE]
# Writes $OUT/serve-25d-now.json (bench record), $OUT/serve-25d-overhead-{now,base}.json and their logs.
# About 4-6 minutes for this tree (two server starts with dummy weights, one offline engine), 2 for BASE.
set -u
HERE="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${1:-}"
: "${OUT:?set OUT to the folder for the results}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TMPDIR=$OUT
ORIGINAL_PYTHONPATH="${PYTHONPATH:-}"
tree_path() {  # the PYTHONPATH that makes TREE's code the one imported
  echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src${ORIGINAL_PYTHONPATH:+:$ORIGINAL_PYTHONPATH}"
}
[ -f /tmp/word-tokenizer/tokenizer.json ] || python "$HERE/benchmarks/word_tokenizer.py" --vocab-size 151936 --out /tmp/word-tokenizer
python -c "import uvloop" 2>/dev/null && echo "uvloop: installed" || echo "uvloop: absent"
python -c "import httptools" 2>/dev/null && echo "httptools: installed (uvicorn parses HTTP in C)" || echo "httptools: absent (uvicorn uses h11)"
FLAGS="--model $HERE/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer"
LOAD="--endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress"

cd "$HERE"
export PYTHONPATH="$(tree_path "$HERE")"
python -c "import infer_core, sys; print('measuring', infer_core.__file__, 'python', sys.version.split()[0])"
timeout "${LIMIT:-300}" python -m infer_core.cli bench serve --start-server "$FLAGS" --offline-row \
  --concurrency 1 16 64 256 $LOAD --label now --json "$OUT/serve-25d-now.json" > "$OUT/bench-25d-now.log" 2>&1
echo "bench rc=$?"
grep -v httpx "$OUT/bench-25d-now.log" | grep -E "^==|output throughput|TTFT|core steps|core time|of offline|duration" | tail -40
timeout "${LIMIT_OVERHEAD:-200}" python "$HERE/benchmarks/serve_overhead.py" --start-server "$FLAGS" \
  --concurrency 64 256 $LOAD --label now --json "$OUT/serve-25d-overhead-now.json" > "$OUT/overhead-25d-now.log" 2>&1
echo "overhead (this tree) rc=$?"
grep '^{' "$OUT/overhead-25d-now.log"

if [ -n "$BASE" ]; then
  BASE="$(cd "$BASE" && pwd)"
  cd "$BASE"
  export PYTHONPATH="$(tree_path "$BASE")"
  python -c "import infer_core; print('base: measuring', infer_core.__file__)"
  timeout "${LIMIT_OVERHEAD:-200}" python "$HERE/benchmarks/serve_overhead.py" --start-server "$FLAGS" \
    --concurrency 64 256 $LOAD --label base --json "$OUT/serve-25d-overhead-base.json" > "$OUT/overhead-25d-base.log" 2>&1
  echo "overhead (base) rc=$?"
  grep '^{' "$OUT/overhead-25d-base.log"
fi
