"""``INFER_DECODING=draft``: a second tiny checkpoint drafts, the target verifies. Greedy output is the plain
output, also with chunked prefill, prefix-cache hits and preemption (the draft's KV cache mirrors the target's
blocks); a draft identical to the target is always accepted at temperature 0; a draft with another vocabulary
is refused at start, naming both models."""

from __future__ import annotations

import random

import pytest
from infer_core import LLM, SamplingParams
from infer_core.bench.engine_runs import speculative_figures
from infer_core.interfaces import PluginError
from infer_core.testing import write_word_tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def prompts(seed: int = 11, lengths=(6, 30, 90, 120, 12)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 40) for _ in range(n)] for n in lengths]


def tokens(outputs) -> list[list[int]]:
    return [list(c.token_ids) for o in outputs for c in o.outputs]


@pytest.fixture(scope="module")
def target(tiny_checkpoint):
    return str(tiny_checkpoint("qwen3"))


@pytest.fixture(scope="module")
def plain(target):
    """The plain greedy tokens of ``prompts()`` (float32: chunking and batching change no argmax here)."""
    return tokens(LLM(target, block_size=16).generate(prompts(), GREEDY, use_tqdm=False))


@pytest.fixture(scope="module")
def draft(tiny_checkpoint):
    """The target's first layer only (the same seed): it agrees with the target now and then."""
    return str(tiny_checkpoint("qwen3", num_hidden_layers=1))


@pytest.mark.parametrize("settings", [
    {},
    # prompt chunks beside verify steps; 320 KV slots for the 418 the batch needs: preemption while drafting
    {"max_num_batched_tokens": 24, "num_kv_blocks": 20},
])
def test_greedy_tokens_equal_plain_greedy(target, draft, plain, settings):
    llm = LLM(target, block_size=16, decoding="draft", speculative_model=draft, num_speculative_tokens=3, **settings)
    assert tokens(llm.generate(prompts(), GREEDY, use_tqdm=False)) == plain
    stats = llm.engine.decoding.stats()
    assert stats.num_accepted_tokens > 5 and stats.num_draft_tokens > stats.num_accepted_tokens  # both paths
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    figures = speculative_figures(llm)
    assert figures["decoding"] == "draft" and figures["acceptance_rate"] == round(stats.acceptance_rate, 4)
    if settings:
        assert llm.engine.stats().num_preemptions > 0
    else:  # the same prompts again: whole prompts from the prefix cache, the draft computes them itself
        assert tokens(llm.generate(prompts(), GREEDY, use_tqdm=False)) == plain
        assert llm.engine.stats().prefix_hit_tokens > 0
    assert llm.engine.scheduler.kv_allocator.num_free_blocks == llm.engine.num_kv_blocks


def test_a_draft_identical_to_the_target_is_always_accepted(target, plain):
    llm = LLM(target, block_size=16, decoding="draft", speculative_model=target, num_speculative_tokens=4)
    assert tokens(llm.generate(prompts(), GREEDY, use_tqdm=False)) == plain
    stats = llm.engine.decoding.stats()
    assert stats.num_draft_tokens > 50 and stats.acceptance_rate > 0.97
    assert stats.mean_acceptance_length > 3


def test_a_draft_with_another_vocabulary_is_refused(target, tiny_checkpoint):
    other = str(tiny_checkpoint("qwen3", vocab_size=512))
    with pytest.raises(PluginError, match="vocabulary of 512 tokens and the target .* one of 384") as error:
        LLM(target, decoding="draft", speculative_model=other)
    assert other in str(error.value) and target in str(error.value)
    with pytest.raises(PluginError, match="INFER_SPECULATIVE_MODEL"):
        LLM(target, decoding="draft")
    # the same vocabulary size, another tokenizer: refused by tokenizer.json
    worded = tiny_checkpoint("qwen3", num_hidden_layers=1, seed=3)
    write_word_tokenizer(worded)
    renamed = tiny_checkpoint("qwen3", num_hidden_layers=1, seed=4)
    write_word_tokenizer(renamed, vocab_size=383)
    with pytest.raises(PluginError, match="different tokenizers") as error:
        LLM(str(worded), decoding="draft", speculative_model=str(renamed))
    assert str(worded) in str(error.value) and str(renamed) in str(error.value)


def test_the_kv_budget_counts_the_draft_cache(target, draft):
    """A block costs the target's bytes plus the draft's, and the draft's scratch blocks come out of the budget."""
    settings = dict(block_size=16, kv_cache_gb=2**-10, max_num_seqs=4, max_model_len=512)  # 1 MiB: < what 4 could use
    plain = LLM(target, **settings).engine.num_kv_blocks
    runner = LLM(target, decoding="draft", speculative_model=draft, **settings).engine.executor.worker.runner
    target_bytes, draft_bytes = 2 * 2 * 16 * 2 * 32 * 4, 1 * 2 * 16 * 2 * 32 * 4  # layers, K+V, tokens, heads, dim, fp32
    assert plain == 2**20 // target_bytes
    scratch = -(-4 * runner.draft.scratch_per_row * draft_bytes // (target_bytes + draft_bytes))
    assert runner.draft.scratch_start - 1 == 2**20 // (target_bytes + draft_bytes) - scratch
    assert runner.draft.kv_caches[0].shape[1] == runner.draft.scratch_start + 4 * runner.draft.scratch_per_row
