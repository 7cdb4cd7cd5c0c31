"""The host fast paths give what the general paths gave.

- The scheduler asks the allocator to cache prefix blocks only when one became full: with
  speculative drafts a step may fill a block it does not compute, and that block must still be
  cached on a later step.
- Final-only outputs (``LLM.generate``): the text decoded once at the end equals the streamed
  text (forced tokens whose characters span tokens, any chunking, end on a stop token, abort),
  and ``LLM.generate`` returns what streaming through ``Engine.step`` returns.
- Streamed outputs are snapshots: one held from an earlier step does not change later.
"""

from __future__ import annotations

import random

import pytest

from infer_core import LLM, SamplingParams
from infer_core.builtin.kv_paged import PagedKVAllocator
from infer_core.builtin.scheduler_fcfs import FCFSScheduler
from infer_core.engine.detokenizer import IncrementalDetokenizer, backend_decoder
from infer_core.engine.output_processor import OutputProcessor
from infer_core.interfaces import Request, RequestStatus, RequestUpdate, RunnerOutput, SchedulerConfig

EOS = 2
TEXTS = [
    "héllo wörld, naïve café — “quotes” … ½ €",
    "日本語のテキストです。漢字とひらがな。",
    "emoji 😀🎉🚀 👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "Привет, мир! Ελληνικά, עברית, العربية",
    "plain ASCII: def f(x):\n    return x + 1\n",
]


# ---------------------------------------------------------------------------------------------
# prefix caching with drafts


@pytest.mark.parametrize("num_drafts", [1, 2, 3])
@pytest.mark.parametrize("prompt_len", [1, 2, 3, 5])
def test_blocks_filled_by_accepted_drafts_are_cached(num_drafts, prompt_len):
    block_size = 4
    allocator = PagedKVAllocator(64, block_size, enable_prefix_caching=True)
    scheduler = FCFSScheduler(SchedulerConfig(4, 64, 200, num_drafts), allocator)
    request = Request("r", list(range(10, 10 + prompt_len)), SamplingParams(max_tokens=100), 100, frozenset({EOS}))
    scheduler.add(request)
    rng = random.Random(prompt_len * 10 + num_drafts)
    for _ in range(12):
        if request.num_tokens - request.num_computed_tokens == 1:
            request.spec_token_ids = [rng.randrange(3, 50) for _ in range(num_drafts)]
        out = scheduler.schedule()
        request.spec_token_ids = []
        drafts = out.spec_token_ids.get("r", [])
        accepted = drafts[: rng.randrange(len(drafts) + 1)] + [rng.randrange(3, 50)]
        # every block full of tokens computed after this step is offered to the prefix cache
        computed_after = min(request.num_computed_tokens + out.num_scheduled_tokens["r"], request.num_tokens)
        hit = allocator.lookup_prefix("probe", request.all_token_ids, computed_after)
        allocator.seq_keys.pop("probe", None)
        assert hit.num_tokens == computed_after // block_size * block_size, (request.num_computed_tokens, out)
        scheduler.update(out, RunnerOutput(["r"], [accepted], [None]), {"r": accepted})
    assert request.num_output_tokens > 12  # drafts were accepted


# ---------------------------------------------------------------------------------------------
# final-only text


@pytest.fixture(scope="module")
def tokenizer():
    from infer_core.testing import default_model_tokenizer

    tokenizer = default_model_tokenizer()
    assert backend_decoder(tokenizer) is not None  # the fast decoder, and so the final-only text, is exercised
    return tokenizer


def test_backend_decoder_decodes_as_the_tokenizer(tokenizer):
    fast = backend_decoder(tokenizer)
    rng = random.Random(0)
    assert all(fast([t], skip_special_tokens=False) == tokenizer.decode([t]) for t in range(len(tokenizer)))
    for _ in range(500):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 12))] + [EOS]
        for skip in (False, True):
            assert fast(ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip_special_tokens=skip)


def _fields_now(output):
    c = output.outputs[0]
    return (c.text, c.delta_text, list(c.token_ids), list(c.delta_token_ids), c.finish_reason, c.stop_reason,
            output.finished)


def _run(tokenizer, prompt_ids, output_ids, chunks, final_only, *, stop_on_eos=False, abort_after=None,
         params=None):
    """Drive an OutputProcessor as the engine would (``chunks``: tokens per step); each output's
    fields as they were when it was handed out (a final-only caller reads them at once)."""
    params = params or SamplingParams()
    processor = OutputProcessor(tokenizer)
    processor.add("p", None, prompt_ids, [("p", params)], arrival_time=0.0, final_only=final_only)
    request = Request("p", list(prompt_ids), params, max_tokens=len(output_ids), eos_token_ids=frozenset({EOS}))
    seen, start = [], 0
    for step, size in enumerate(chunks):
        new = output_ids[start : start + size]
        start += size
        request.all_token_ids.extend(new)
        is_last = start >= len(output_ids)
        if is_last:
            request.status = RequestStatus.FINISHED_STOPPED if stop_on_eos else RequestStatus.FINISHED_LENGTH
        outputs, _ = processor.process([RequestUpdate(request, new, None, is_last)])
        seen.append(_fields_now(outputs[0]))
        if abort_after == step:
            seen.append(_fields_now(processor.abort("p")))
            break
    return seen


def _chunkings(n: int, rng: random.Random):
    yield [1] * n
    yield [n]
    for _ in range(3):
        sizes, left = [], n
        while left:
            sizes.append(min(left, rng.randrange(1, 4)))
            left -= sizes[-1]
        yield sizes


@pytest.mark.parametrize("text", TEXTS)
def test_final_only_text_equals_the_streamed_text(tokenizer, text):
    rng = random.Random(text)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    ids = encode(text)
    prompts = [encode("Say:"), encode("前の文章 😀"), encode(text)[:3]]  # the last may end inside a character
    num_cut = 0
    for prompt_ids in prompts:
        for m in range(1, len(ids) + 1):  # every length, so generation ends inside characters too
            output_ids = ids[:m]
            num_cut += tokenizer.decode(output_ids).endswith("\ufffd")
            for chunks in _chunkings(m, rng):
                streamed = _run(tokenizer, prompt_ids, output_ids, chunks, final_only=False)
                final_only = _run(tokenizer, prompt_ids, output_ids, chunks, final_only=True)
                assert final_only[-1] == streamed[-1], (prompt_ids, m, chunks)
                # the steps before the end carry the token deltas, not yet the text
                assert [f[3] for f in final_only] == [f[3] for f in streamed]
                assert all(f[0] == f[1] == "" and not f[-1] for f in final_only[:-1])
    assert num_cut >= 3 or "ASCII" in text


def test_final_only_text_ends_on_a_stop_token_and_on_abort(tokenizer):
    ids = tokenizer.encode(TEXTS[1], add_special_tokens=False)
    prompt_ids = tokenizer.encode("Say:", add_special_tokens=False)
    for include in (False, True):
        params = SamplingParams(include_stop_str_in_output=include, skip_special_tokens=False)
        output_ids = ids + [EOS]
        streamed = _run(tokenizer, prompt_ids, output_ids, [1] * len(output_ids), False, stop_on_eos=True,
                        params=params)
        final_only = _run(tokenizer, prompt_ids, output_ids, [1] * len(output_ids), True, stop_on_eos=True,
                          params=params)
        assert final_only[-1] == streamed[-1]
        assert (tokenizer.decode([EOS]) in streamed[-1][0]) is include
    for abort_after in range(len(ids) - 1):
        streamed = _run(tokenizer, prompt_ids, ids, [1] * len(ids), False, abort_after=abort_after)
        final_only = _run(tokenizer, prompt_ids, ids, [1] * len(ids), True, abort_after=abort_after)
        assert final_only[-1] == streamed[-1]
        assert streamed[-1][4] == "abort"


def test_update_steps_replays_steps_that_end_inside_a_character(tokenizer):
    """Characters that span steps: the joined steps are held back and replayed one by one."""
    ids = tokenizer.encode("😀🎉 語", add_special_tokens=False)
    cut = next(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd"))
    steps = [[t] for t in ids[:cut]] + [ids[cut:]]
    streamed = IncrementalDetokenizer(tokenizer, [], True)
    deltas = [streamed.update(step) for step in steps]
    at_once = IncrementalDetokenizer(tokenizer, [], True, backend_decoder(tokenizer))
    assert at_once.update_steps(steps) == ("".join(deltas), deltas[-1]) == ("😀🎉 語", deltas[-1])


# ---------------------------------------------------------------------------------------------
# the real model: LLM.generate against streaming, and snapshots


@pytest.fixture(scope="module")
def llm():
    engine = LLM(kv_cache_gb=0.5, enable_prefix_caching=False)  # a repeated prompt counts no cached tokens
    yield engine
    engine.shutdown()


def _stream(llm, prompts, params):
    engine = llm.engine
    ids = [engine.add_request(None, p, params, add_special_tokens=False) for p in prompts]
    steps: dict[str, list] = {i: [] for i in ids}
    while engine.has_unfinished_requests():
        for output in engine.step():
            steps[output.request_id].append(output)
    return [steps[i] for i in ids]


def _fields(output):
    completions = [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason, c.logprobs, c.delta_text,
                    c.delta_token_ids) for c in output.outputs]
    return output.prompt, output.prompt_token_ids, completions, output.finished, output.num_cached_tokens


def test_generate_returns_what_streaming_returns(llm):
    questions = ["Write a sentence in Japanese.", "Repeat exactly: 😀 café 日本語 naïve 🎉 Привет",
                 "What is the capital of France?"]
    prompts = [llm.engine.render_chat([{"role": "user", "content": q}]) for q in questions]
    for params in (SamplingParams(temperature=0, max_tokens=20),
                   SamplingParams(temperature=0.8, seed=7, n=2, max_tokens=12, logprobs=2),
                   SamplingParams(temperature=0, max_tokens=20, stop=["the"])):
        streamed = [steps[-1] for steps in _stream(llm, prompts, params)]
        generated = llm.generate(prompts, params, use_tqdm=False, add_special_tokens=False)
        assert [_fields(o) for o in generated] == [_fields(o) for o in streamed]
    assert any(ord(ch) > 0x7FF for o in streamed for c in o.outputs for ch in c.text)


def test_an_output_held_from_an_earlier_step_does_not_change(llm):
    prompt = llm.engine.render_chat([{"role": "user", "content": "Write a sentence in Japanese."}])
    params = SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=16, logprobs=1)
    (steps,) = _stream(llm, [prompt], params)
    seen = {0: ([], "", 0), 1: ([], "", 0)}  # per completion: tokens, text and logprobs streamed so far
    for output in steps:
        for c in output.outputs:
            tokens, text, num_logprobs = seen[c.index]
            tokens, text = tokens + c.delta_token_ids, text + c.delta_text
            num_logprobs += len(c.delta_token_ids)
            assert (c.token_ids, c.text, len(c.logprobs)) == (tokens, text, num_logprobs)
            seen[c.index] = (tokens, text, num_logprobs)
    assert len(steps) > 8 and all(len(c.token_ids) == 16 for c in steps[-1].outputs)
