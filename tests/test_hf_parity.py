"""The engine against HF transformers, CPU float32, on tiny random checkpoints of every architecture.

For a batch of 8 prompts of 5 to 300 tokens: the logits at each prompt's last position within
1e-4 relative, and 64 greedy tokens identical to ``generate`` — as one batch, with small prefill
chunks, with a shared 200-token prefix served from the prefix cache, and with a KV pool of about
a quarter of the blocks needed (requests preempted and recomputed). On CUDA (``-m gpu``) the
same checks run with the model on the GPU in float32.
"""

from __future__ import annotations

import random

import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.testing import LogitsRecorder

NUM_NEW_TOKENS = 64
PROMPT_LENGTHS = (5, 17, 64, 300, 33, 128, 9, 250)
BLOCK_SIZE = 16


def _prompts(seed: int, vocab: int, shared_prefix: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(max(n - shared_prefix, 1))] for n in PROMPT_LENGTHS]


class Reference:
    """HF transformers' greedy continuation and last-position logits, one prompt at a time."""

    def __init__(self, folder) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.no_grad()
    def run(self, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
        ids = torch.tensor([prompt])
        logits = self.model(ids).logits[0, -1].float()
        out = self.model.generate(ids, max_new_tokens=NUM_NEW_TOKENS, min_new_tokens=NUM_NEW_TOKENS,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist(), logits


@pytest.fixture(scope="module")
def references(tiny_checkpoint):
    cache = {}

    def get(kind: str, shared_prefix: int):
        key = (kind, shared_prefix)
        if key not in cache:
            folder = tiny_checkpoint(kind)
            ref = Reference(folder)
            vocab = ref.model.config.vocab_size
            prompts = _prompts(sum(map(ord, kind)), vocab, shared_prefix)
            cache[key] = (folder, prompts, [ref.run(p) for p in prompts])
        return cache[key]

    return get


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    return request.param


def _run_engine(folder, prompts, device, **settings):
    llm = LLM(str(folder), block_size=BLOCK_SIZE, device=device, dtype="float32", **settings)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    first_logits = [recorder.logits[o.request_id][0] for o in outputs]
    return llm, outputs, first_logits


def _check(outputs, first_logits, expected) -> None:
    for i, (output, logits, (ref_tokens, ref_logits)) in enumerate(zip(outputs, first_logits, expected)):
        rel = (logits - ref_logits).norm() / ref_logits.norm()
        assert rel < 1e-4, f"prompt {i} ({PROMPT_LENGTHS[i]} tokens): last-position logits differ by {rel:.2e}"
        assert output.outputs[0].token_ids == ref_tokens, f"prompt {i} ({PROMPT_LENGTHS[i]} tokens): greedy tokens differ"
        assert output.outputs[0].finish_reason == "length"


def test_batch_matches_hf(tiny_kind, references, device):
    folder, prompts, expected = references(tiny_kind, 0)
    llm, outputs, logits = _run_engine(folder, prompts, device, enable_prefix_caching=False)
    _check(outputs, logits, expected)
    assert llm.engine.stats().num_preemptions == 0


def test_chunked_prefill_matches_hf(tiny_kind, references, device):
    folder, prompts, expected = references(tiny_kind, 0)
    llm, outputs, logits = _run_engine(folder, prompts, device, max_num_batched_tokens=32, enable_prefix_caching=False)
    _check(outputs, logits, expected)


def test_prefix_cache_hits_match_hf(tiny_kind, references, device):
    folder, prompts, expected = references(tiny_kind, 200)
    llm, outputs, logits = _run_engine(folder, prompts, device, enable_prefix_caching=True)
    _check(outputs, logits, expected)
    stats = llm.engine.stats()
    # 7 of the 8 prompts find the 200-token prefix (12 full blocks of 16) already cached.
    assert stats.prefix_hit_tokens >= 7 * (200 // BLOCK_SIZE) * BLOCK_SIZE
    assert sum(o.num_cached_tokens for o in outputs) == stats.prefix_hit_tokens


def test_small_kv_pool_preempts_and_matches_hf(tiny_kind, references, device):
    folder, prompts, expected = references(tiny_kind, 0)
    needed = sum(-(-(len(p) + NUM_NEW_TOKENS) // BLOCK_SIZE) for p in prompts)
    largest = max(-(-(len(p) + NUM_NEW_TOKENS) // BLOCK_SIZE) for p in prompts)
    num_blocks = max(needed // 4, largest)
    llm, outputs, logits = _run_engine(folder, prompts, device, num_kv_blocks=num_blocks, enable_prefix_caching=False)
    _check(outputs, logits, expected)
    assert llm.engine.stats().num_preemptions > 0
