# Issue 25 probe: where a prefill step's host time goes (flash and triton; 1x512 and 16x512 tokens).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
for att in flash triton; do
  for n in 1 16; do
    echo "=== attention=$att num_prompts=$n prompt_len=512 (torch.profiler) ==="
    timeout 150 python -m benchmarks.first_steps --model Qwen3-0.6B --attention $att --prompt-len 512 --num-prompts $n --steps 3 2>&1 | grep -v "^\s*$" | head -75
  done
done
echo "=== flash 16x512 cProfile ==="
timeout 150 python -m benchmarks.first_steps --model Qwen3-0.6B --attention flash --prompt-len 512 --num-prompts 16 --steps 3 --cprofile 2>&1 | grep -v "^\s*$" | head -110
