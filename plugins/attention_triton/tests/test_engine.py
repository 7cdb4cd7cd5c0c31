"""The whole engine with INFER_ATTENTION=triton against the torch backend (CPU, float32, interpreter).

Prompts of mixed lengths share a prefix (prefix-cache hits) and are fed in 32-token chunks next
to decoding requests (mixed steps, chunk boundaries inside blocks); the greedy tokens must be the
same as the torch backend's, and the logits close.
"""

from __future__ import annotations

import random

import pytest
from infer_core import LLM, SamplingParams
from infer_core.testing import TINY_ARCHITECTURES, TINY_MOE_ARCHITECTURES, LogitsRecorder, make_tiny_checkpoint

PROMPT_LENGTHS = (5, 70, 17, 130, 33)
NUM_NEW_TOKENS = 12


def prompts(vocab: int, shared_prefix: int) -> list[list[int]]:
    rng = random.Random(vocab + shared_prefix)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    return [
        (prefix + [rng.randrange(3, vocab) for _ in range(n)])[: max(n, 1)]
        if n < shared_prefix
        else prefix + [rng.randrange(3, vocab) for _ in range(n - shared_prefix)]
        for n in PROMPT_LENGTHS
    ]


def generate(folder, attention: str, batch_prompts, **settings):
    llm = LLM(str(folder), attention=attention, device="cpu", dtype="float32", block_size=16, **settings)
    assert llm.engine.config.implementations["attention"] == attention
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(batch_prompts, params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs], [recorder.logits[o.request_id] for o in outputs]


def assert_same_as_torch(folder, batch_prompts, **settings):
    _, expected_tokens, expected_logits = generate(folder, "torch", batch_prompts, **settings)
    llm, tokens, logits = generate(folder, "triton", batch_prompts, **settings)
    for i, (got, expected) in enumerate(zip(logits, expected_logits)):
        for step, (a, b) in enumerate(zip(got, expected)):
            rel = float((a - b).norm() / b.norm())
            assert rel < 1e-4, f"prompt {i}, token {step}: logits differ by {rel:.2e}"
    assert tokens == expected_tokens
    return llm


# the dense architectures: a mixture of experts has the same attention (and the interpreter is slow)
@pytest.mark.parametrize("kind", sorted(set(TINY_ARCHITECTURES) - set(TINY_MOE_ARCHITECTURES)))
def test_engine_greedy_tokens_match_torch(tmp_path, kind):
    folder = make_tiny_checkpoint(kind, tmp_path / kind)
    batch_prompts = prompts(384, 40)
    llm = assert_same_as_torch(folder, batch_prompts, max_num_batched_tokens=32, enable_prefix_caching=True)
    assert llm.engine.stats().prefix_hit_tokens > 0  # the 40-token prefix's two full blocks were reused


def test_engine_sliding_window_matches_torch(tmp_path):
    folder = make_tiny_checkpoint("mistral", tmp_path / "mistral-sw", sliding_window=24)
    llm = assert_same_as_torch(folder, prompts(384, 0), max_num_batched_tokens=48, enable_prefix_caching=False)
    assert llm.engine.config.model.sliding_window(0) == 24
