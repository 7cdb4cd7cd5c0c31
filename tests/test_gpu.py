"""The core on a CUDA device: default model, bfloat16 accuracy, a real-sized model with profiled KV sizing.

Run on the GPU machine with ``python -m pytest -m gpu``; skipped without CUDA. (The HF parity
suite also runs its float32 checks on CUDA under the same marker.)
"""

from __future__ import annotations

import logging
import random

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.testing import LogitsRecorder, write_config_checkpoint

pytestmark = pytest.mark.gpu

# The published shape of Qwen3-0.6B (values from its config.json).


def test_default_model_on_cuda_matches_hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infer_core.models.source import default_model_source

    question = [{"role": "user", "content": "What is the capital of France?"}]
    llm = LLM(device="cuda", dtype="float32")
    completion = llm.chat(question, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0].outputs[0]
    assert "Paris" in completion.text
    source = default_model_source()
    tokenizer = AutoTokenizer.from_pretrained(str(source.path), gguf_file=source.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(source.path), gguf_file=source.gguf_file, dtype=torch.float32)
    ids = tokenizer(tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        reference = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:].tolist()
    assert completion.token_ids == reference


def test_bfloat16_logits_close_to_float32_reference(tiny_checkpoint, tiny_kind):
    from transformers import AutoModelForCausalLM

    folder = tiny_checkpoint(tiny_kind)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (7, 90, 300)]
    llm = LLM(str(folder), device="cuda", dtype="bfloat16", max_num_batched_tokens=64)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0, -1]
        got = recorder.logits[output.request_id][0]
        rel = (got - expected).norm() / expected.norm()
        assert rel < 2e-2, f"{tiny_kind}, {len(prompt)}-token prompt: bfloat16 logits off by {rel:.3e}"


def test_real_sized_model_sizes_kv_by_profiling(tmp_path, caplog):
    write_config_checkpoint("Qwen3-0.6B", tmp_path)
    caplog.set_level(logging.INFO)
    llm = LLM(str(tmp_path), load_format="dummy", max_model_len=8192)
    assert llm.engine.config.dtype == "bfloat16"
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache:"))
    assert f"{llm.engine.num_kv_blocks} blocks of {llm.engine.config.block_size} tokens" in line
    free, total = torch.cuda.mem_get_info()
    kv_bytes = sum(t.numel() * t.element_size() for t in llm.engine.executor.worker.runner.kv_caches)
    # The pool takes what gpu_memory_utilization (0.9) leaves after weights and the profiled peak,
    # which keeps the whole process under 90% of the GPU and leaves a 0.6B model most of it for KV.
    assert total - free <= 0.9 * total
    assert kv_bytes >= 0.6 * total
    rng = random.Random(0)
    prompts = [[rng.randrange(0, 151936) for _ in range(rng.randrange(10, 1500))] for _ in range(24)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.6, max_tokens=64, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [64] * 24
