"""LangChain and lm-eval-harness against ``infer serve`` on the default model, as their users run them.

Both clients are in the project's test extra, so CI runs them; each is skipped where its client is not installed.
lm-eval's loglikelihoods are checked against the engine's own prompt logprobs, which
tests/test_prompt_logprobs.py checks against HF transformers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


class City(BaseModel):
    """A city and its country."""

    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


def get_weather(city: str, unit: str) -> str:
    """The current weather in a city, in celsius or fahrenheit."""
    return f"sunny in {city}"


def _missing(module: str):
    """Skipped before any fixture is set up (no server starts for a test that cannot run)."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


@_missing("langchain_openai")
def test_langchain_structured_output_and_required_tools(server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=f"{server.base_url}/v1", api_key="unused", temperature=0, max_tokens=80)
    city = chat.with_structured_output(City).invoke("Name a large city.")
    assert isinstance(city, City)
    bound = chat.bind_tools([get_weather], tool_choice="required")
    whole = bound.invoke("What is the weather in Paris?")
    assert whole.tool_calls and whole.tool_calls[0]["name"] == "get_weather"
    assert set(whole.tool_calls[0]["args"]) == {"city", "unit"}
    streamed = None
    for chunk in bound.stream("What is the weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]


DATA = [{"question": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "label": 0},
        {"question": "Two plus two equals", "choices": ["four", "five"], "label": 0}]


def _tasks(folder: Path) -> None:
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DATA))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (folder / "tiny_ll.yaml").write_text(
        f"task: tiny_ll\n{common}output_type: multiple_choice\ndoc_to_text: \"{{{{question}}}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\ntarget_delimiter: \" \"\n"
        "metric_list:\n  - metric: acc\n")
    (folder / "tiny_gen.yaml").write_text(
        f"task: tiny_gen\n{common}output_type: generate_until\ndoc_to_text: \"Q: {{{{question}}}}\\nA:\"\n"
        "doc_to_target: \"{{choices[label]}}\"\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 8\n"
        "metric_list:\n  - metric: exact_match\n")


@_missing("lm_eval")
def test_lm_eval_local_completions(server, offline_llm, tmp_path):
    from infer_core import SamplingParams

    tokenizer = offline_llm.get_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    _tasks(tmp_path)
    args = (f"model={MODEL},base_url={server.base_url}/v1/completions,tokenizer={tmp_path / 'tokenizer'},"
            "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
                           "--tasks", "tiny_ll,tiny_gen", "--include_path", str(tmp_path), "--batch_size", "1",
                           "--output_path", str(tmp_path / "out"), "--log_samples"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    samples = [json.loads(line) for f in sorted((tmp_path / "out").rglob("samples_tiny_ll_*.jsonl"))
               for line in f.read_text().splitlines()]
    assert len(samples) == len(DATA)
    for sample in samples:
        doc = sample["doc"]
        context = tokenizer.encode(doc["question"], add_special_tokens=False)
        for choice, (loglikelihood, _) in zip(doc["choices"], (r[0] for r in sample["resps"])):
            full = tokenizer.encode(doc["question"] + " " + choice, add_special_tokens=False)
            scored = offline_llm.generate([full], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
            expected = sum(scored.prompt_logprobs[i][full[i]].logprob for i in range(len(context), len(full)))
            assert float(loglikelihood) == pytest.approx(expected, abs=1e-4)
    assert list((tmp_path / "out").rglob("samples_tiny_gen_*.jsonl"))
