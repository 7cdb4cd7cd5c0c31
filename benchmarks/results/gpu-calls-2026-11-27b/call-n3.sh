# Issue 25: the serving acceptance run (c=1/16/64/256 + the offline row) on this tree (piecewise CUDA graphs),
# then the base tree (5869c4f, before them) at c=256 with its offline row, on the same machine.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TMPDIR=$OUT
HERE=$(pwd)
tree_path() { echo "$1:$1/plugins/attention_triton/src:$1/plugins/attention_flash/src:$1/plugins/parallel_tp/src:$1/plugins/parallel_ep/src:$1/plugins/quant_w8a8/src:$1/plugins/spec_decode/src:$PYTHONPATH"; }
python "$HERE/benchmarks/word_tokenizer.py" --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
FLAGS="--model $HERE/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer"
LOAD="--endpoint completions --num-prompts 256 --input-len 512 --output-len 128 --no-progress"
run() {  # label tree concurrency...
  label=$1; tree=$2; shift 2
  (cd "$tree" && PYTHONPATH="$(tree_path "$tree")" timeout 280 python -m infer_core.cli bench serve --start-server "$FLAGS" \
     --offline-row --concurrency "$@" $LOAD --label $label --json "$OUT/serve-$label.json" > "$OUT/bench-$label.log" 2>&1)
  echo "$label rc=$?"
  grep -v httpx "$OUT/bench-$label.log" | grep -E "^==|output throughput|TTFT|core steps|core time|of offline|piecewise|captured" | tail -40
}
run now "$HERE" 1 16 64 256
run base "$HERE/.wt/base" 256
