#!/usr/bin/env bash
# Why the core branch's server never says ready on the GPU: stacks of every process after 75 s.
set -u
cd "$(dirname "$0")/.."
M=$PWD; W=$PWD/.wt/core
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONFAULTHANDLER=1
export PYTHONPATH="$W:$W/plugins/attention_triton/src:$W/plugins/attention_flash/src:$W/plugins/parallel_tp/src:$PYTHONPATH"
python -m benchmarks.word_tokenizer --vocab-size 151936 --out /tmp/word-tokenizer >/dev/null
cd $W
python -m infer_core.cli serve --model $M/benchmarks/configs/Qwen3-0.6B --load-format dummy --tokenizer /tmp/word-tokenizer --port 8077 > $OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 1 75); do sleep 1; curl -s -o /dev/null -w "%{http_code}" localhost:8077/health | grep -q 200 && { echo "ready after $i s"; break; }; done
ps -eo pid,ppid,stat,etime,args | grep -E "[p]ython" | cut -c1-200
for p in $(pgrep -f "[m]ultiprocessing") $SP; do echo "== ABRT $p"; kill -ABRT $p; done
sleep 3
grep -v "^$" $OUT/serve.log | tail -150
# then the same with the default model's tokenizer-free path (token ids only)
pkill -9 -f "[i]nfer_core"; sleep 2
python -m infer_core.cli serve --model $M/benchmarks/configs/Qwen3-0.6B --load-format dummy --port 8078 > $OUT/serve2.log 2>&1 &
for i in $(seq 1 60); do sleep 1; curl -s -o /dev/null -w "%{http_code}" localhost:8078/health | grep -q 200 && { echo "no tokenizer: ready after $i s"; break; }; done
tail -5 $OUT/serve2.log
pkill -9 -f "[i]nfer_core"
