#!/usr/bin/env bash
# Issue 25 on one H100: the new tree's acceptance run (serve_25c.sh: concurrency 1/16/64/256 with the offline
# row, then CPU per token at 64 and 256), then main before the merges (fac2aaf, .wt/base) serving the same load,
# driven by the new tree's client (so the two servers meet the same load generator). From the repo root after
# `source .device/setup.sh`.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
root=$PWD
LIMIT=230 LIMIT_OVERHEAD=120 bash benchmarks/serve_25c.sh "$root" now
base=$root/.wt/base
FLAGS="--model $root/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer"
(cd $base && PYTHONPATH=$base:$base/plugins/attention_triton/src:$base/plugins/attention_flash/src:$base/plugins/parallel_tp/src:$base/plugins/parallel_ep/src:$base/plugins/quant_w8a8/src:$base/plugins/spec_decode/src:$PYTHONPATH \
  setsid python -m infer_core.cli serve $FLAGS --port 8123 > $OUT/base-server.log 2>&1 &)
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
echo "base server ready after ~$i s"
timeout 150 python -m infer_core.cli bench serve --base-url http://127.0.0.1:8123 --endpoint completions --num-prompts 256 \
  --input-len 512 --output-len 128 --no-progress --concurrency 64 256 --label base-fac2aaf --json $OUT/serve-25c-base.json \
  > $OUT/bench-base.log 2>&1
echo "base bench rc=$?"; tail -8 $OUT/bench-base.log
pkill -9 -f "[i]nfer_core.cli serve"; pkill -9 -f "[f]orkserver"
