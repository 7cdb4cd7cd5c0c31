# Issue 25: piecewise CUDA graphs. GPU tests, then the prefill-step probe (flash, triton).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 330 python -m pytest -q -m gpu -x tests/test_piecewise_graphs_gpu.py tests/test_cuda_graphs_gpu.py tests/test_gpu.py \
  tests/test_overlap.py plugins/attention_flash/tests plugins/attention_triton/tests/test_gpu.py -p no:cacheprovider 2>&1 | tail -25
for att in flash triton; do
  for n in 1 16; do
    echo "=== attention=$att num_prompts=$n prompt_len=512 ==="
    timeout 100 python -m benchmarks.first_steps --model Qwen3-0.6B --attention $att --prompt-len 512 --num-prompts $n --steps 3 2>&1 | grep -E "unprofiled|\"step\": 0|piecewise|Error|error" | head -8
  done
done
