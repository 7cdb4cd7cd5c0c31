"""Prompt logprobs through the engine on a tiny checkpoint, against HF transformers' log-softmax of the
same prompt: in one chunk or several, beside ordinary requests, and again when the prompt's blocks are
in the prefix cache (whose hit is then not used)."""

from __future__ import annotations

import math

import pytest
import torch

from infer_core import LLM, SamplingParams

PROMPT = [(7 + 37 * i) % 380 + 3 for i in range(45)]


@pytest.fixture(scope="module")
def path(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("qwen2"))


@pytest.fixture(scope="module")
def hf_logprobs(path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].float()
    return logits.log_softmax(dim=-1)  # row p: the distribution of token p + 1


def _check(output, hf: torch.Tensor, num_top: int) -> None:
    scored = output.prompt_logprobs
    assert len(scored) == len(PROMPT) and scored[0] is None
    for index in range(1, len(PROMPT)):
        entries, expected = scored[index], hf[index - 1]
        token = PROMPT[index]
        assert math.isclose(entries[token].logprob, float(expected[token]), abs_tol=1e-4), index
        assert entries[token].rank == int((expected > expected[token]).sum()) + 1
        top = sorted((lp.rank, tid) for tid, lp in entries.items() if lp.rank <= num_top and tid != token)
        expected_top = expected.topk(num_top).indices.tolist()
        assert [tid for _, tid in top] == [t for t in expected_top if t != token][: len(top)]
        assert len(entries) >= num_top


@pytest.mark.parametrize("chunk", [8192, 16], ids=["one-chunk", "chunked"])
def test_prompt_logprobs_equal_transformers(path, hf_logprobs, chunk):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    with LLM(path, device="cpu", num_kv_blocks=64, max_num_batched_tokens=chunk) as llm:
        plain, scored, again = llm.generate([PROMPT[:20], PROMPT, PROMPT],
                                            [SamplingParams(max_tokens=2), params, params], use_tqdm=False)
        _check(scored, hf_logprobs, 3)
        _check(again, hf_logprobs, 3)  # the same prompt, cached by now: its positions are computed anyway
        assert plain.prompt_logprobs is None and len(plain.outputs[0].token_ids) == 2
        cached = llm.generate([PROMPT], params, use_tqdm=False)[0]
        assert cached.num_cached_tokens == 0
        _check(cached, hf_logprobs, 3)
