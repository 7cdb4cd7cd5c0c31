"""``INFER_DECODING=ngram`` gives the plain greedy tokens: with chunked prefill, prefix-cache hits and
preemption; stop strings, max_tokens, n > 1, streaming and abort behave as without speculation."""

from __future__ import annotations

import random

import pytest
from infer_core import LLM, SamplingParams
from infer_core.bench.engine_runs import speculative_figures

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def repetitive_prompts(seed: int, lengths=(6, 30, 90, 120, 12)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 40) for _ in range(n)] for n in lengths]  # a small alphabet: n-grams recur


def tokens(outputs) -> list[list[int]]:
    return [list(c.token_ids) for o in outputs for c in o.outputs]


@pytest.fixture
def moved_back(monkeypatch) -> list[int]:
    """Positions the runner moved back a step planned over a verify step in flight (overlapped scheduling),
    one entry per such step: the real function runs, this only watches it."""
    from infer_core.runner import accepted_drafts

    moved: list[int] = []
    apply = accepted_drafts.apply_rejections

    def watched(inputs, rejected, block_tables, block_size):
        moved.append(int(rejected.index_select(0, inputs.pending_src).sum()))
        apply(inputs, rejected, block_tables, block_size)

    monkeypatch.setattr(accepted_drafts, "apply_rejections", watched)
    return moved


@pytest.mark.parametrize("settings", [
    {},
    # prompt chunks beside verify steps, drafts dropped where they don't fit; 320 KV slots for the 418 the
    # batch needs: preemption while drafts are verified
    {"max_num_batched_tokens": 24, "num_kv_blocks": 20},
    # each step planned while the one before it runs: drafts follow tokens not read yet
    {"async_scheduling": True},
    {"async_scheduling": True, "max_num_batched_tokens": 24, "num_kv_blocks": 20},
])
def test_greedy_tokens_equal_plain_greedy(tiny_checkpoint, settings, moved_back):
    folder = str(tiny_checkpoint("qwen3"))
    prompts = repetitive_prompts(11)
    plain = LLM(folder, block_size=16, **settings).generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(folder, block_size=16, decoding="ngram", num_speculative_tokens=3, **settings)
    moved_back.clear()
    drafted = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert tokens(drafted) == tokens(plain)
    assert llm.engine.overlap == bool(settings.get("async_scheduling"))
    if llm.engine.overlap:  # steps were planned over verify steps, and some of those rejected drafts
        assert len(moved_back) > 5 and sum(moved_back) > 0
    else:
        assert not moved_back
    stats = llm.engine.decoding.stats()
    assert stats.num_accepted_tokens > 10 and stats.num_draft_tokens > stats.num_accepted_tokens  # both paths
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    figures = speculative_figures(llm)  # what `infer bench latency/throughput` rows carry
    assert figures["decoding"] == "ngram" and figures["acceptance_rate"] == round(stats.acceptance_rate, 4)
    assert figures["acceptance_per_position"][0] == round(stats.accepted_per_position[0] / stats.num_drafts, 4)
    if "num_kv_blocks" in settings:
        assert llm.engine.stats().num_preemptions > 0
    if "num_kv_blocks" not in settings:  # the same prompts again: whole prompts come from the prefix cache
        again = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert tokens(again) == tokens(plain) and llm.engine.stats().prefix_hit_tokens > 0
    assert llm.engine.scheduler.kv_allocator.num_free_blocks == llm.engine.num_kv_blocks


@pytest.fixture(scope="module")
def text_engines(tiny_with_tokenizer):
    folder = str(tiny_with_tokenizer)
    return LLM(folder), LLM(folder, decoding="ngram")


PROMPT = "one two three four five six, one two three four five six, one two three four five six, one two"


def test_text_stop_strings_max_tokens_and_n(text_engines):
    plain, spec = text_engines
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    reference = plain.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    drafted = spec.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert drafted.token_ids == reference.token_ids and drafted.text == reference.text
    assert spec.engine.decoding.stats().num_accepted_tokens > 0  # drafts were kept: several tokens in a step
    stop = reference.text[len(reference.text) // 2:][:6]  # a stop string in the middle of the output
    with_stop = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, stop=[stop], n=2)
    [a], [b] = plain.generate([PROMPT], with_stop, use_tqdm=False), spec.generate([PROMPT], with_stop, use_tqdm=False)
    assert [(c.text, c.finish_reason, c.stop_reason) for c in b.outputs] == \
        [(c.text, c.finish_reason, c.stop_reason) for c in a.outputs]
    assert b.outputs[0].finish_reason == "stop" and len(b.outputs) == 2
    short = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    out = spec.generate([PROMPT], short, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == reference.token_ids[:7] and out.finish_reason == "length"


def test_streaming_and_abort(text_engines):
    plain, spec = text_engines
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    reference = plain.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    engine = spec.engine
    engine.add_request("streamed", PROMPT, params)
    text, token_ids, steps = "", [], 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            text += output.outputs[0].delta_text
            token_ids += output.outputs[0].delta_token_ids
        steps += 1
    assert token_ids == reference.token_ids and text == reference.text
    assert steps < len(reference.token_ids)  # some steps gave several tokens
    engine.add_request("aborted", PROMPT, params)
    for _ in range(3):
        engine.step()
    final = engine.abort("aborted")
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert final.outputs[0].token_ids == reference.token_ids[:len(final.outputs[0].token_ids)]
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.kv_allocator.num_free_blocks == engine.num_kv_blocks


def test_overlapped_steps_with_sampled_requests(tiny_checkpoint, moved_back):
    """A sampled request's drafts are kept at random on the host: while one runs, each step waits for the
    one before it (the seeded tokens are the serial engine's); greedy requests beside it keep the plain tokens,
    and once it ends the steps overlap again."""
    folder = str(tiny_checkpoint("qwen3"))
    prompts = repetitive_prompts(5, lengths=(40, 60))
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, ignore_eos=True, seed=4)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(folder).generate(prompts[1:], greedy, use_tqdm=False)
    serial = LLM(folder, decoding="ngram", num_speculative_tokens=3, async_scheduling=False)
    expected = serial.generate(prompts, [sampled, greedy], use_tqdm=False)
    llm = LLM(folder, decoding="ngram", num_speculative_tokens=3, async_scheduling=True)
    moved_back.clear()
    got = llm.generate(prompts, [sampled, greedy], use_tqdm=False)
    assert tokens(got[:1]) == tokens(expected[:1]) and tokens(got[1:]) == tokens(plain)
    assert moved_back  # after the sampled request's 8 tokens the greedy one went on overlapped


@pytest.mark.parametrize("overlap", [False, True])
def test_tensor_parallel_ngram_gives_plain_greedy_tokens(tiny_checkpoint, overlap):
    """Two ranks (gloo) verify the same drafts: each samples from the all-gathered logits and, overlapped, moves
    its own planned step back by the drafts its own verify step rejected; the tokens are one rank's plain ones."""
    pytest.importorskip("infer_parallel_tp")
    folder = str(tiny_checkpoint("qwen3"))
    prompts = repetitive_prompts(7, lengths=(30, 90, 12))
    settings = {"device": "cpu", "dtype": "float32", "block_size": 16, "num_kv_blocks": 64}
    plain = LLM(folder, **settings).generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(folder, tensor_parallel_size=2, decoding="ngram", num_speculative_tokens=3, async_scheduling=overlap,
              **settings)
    try:
        assert llm.engine.overlap is overlap
        drafted = llm.generate(prompts, GREEDY, use_tqdm=False)
        stats = llm.engine.decoding.stats()
    finally:
        llm.shutdown()
    assert tokens(drafted) == tokens(plain)
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0
