"""Sampling through the engine on a tiny real checkpoint (prompts are token ids): seeds across
batches and preemption, top_k=1, stops, min_tokens, logprobs against HF, n completions.
"""

from __future__ import annotations


import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.testing import make_tiny_checkpoint


def _prompt(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % 380 + 3 for i in range(length)]


def _llm(path: str, **settings) -> LLM:
    """An engine on the tiny checkpoint with a small KV pool, on the CPU wherever the suite runs: the
    preemption arithmetic assumes the CPU's 16-token blocks and the HF comparisons float32 (on CUDA
    the default backend's blocks hold 256 tokens); the GPU sampler is tested in tests/sampling."""
    return LLM(path, **{"num_kv_blocks": 256, "device": "cpu", **settings})


def _completions(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny_path(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("qwen3"))


def test_seeded_request_reproduces_across_batches_and_preemption(tiny_path):
    prompt = _prompt(17)
    seeded = SamplingParams(seed=1234, temperature=0.9, max_tokens=24, ignore_eos=True)
    alone = _completions(_llm(tiny_path), [prompt], seeded)[0]
    assert len(alone) == 24

    others = [
        (_prompt(3, 11), SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)),
        (_prompt(75, 5), SamplingParams(seed=7, temperature=0.6, top_p=0.9, max_tokens=20, ignore_eos=True)),
        (_prompt(100, 9), SamplingParams(temperature=1.2, top_k=20, max_tokens=24, ignore_eos=True)),
        (_prompt(30, 2), SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)),
        (_prompt(52, 4), SamplingParams(seed=1234, temperature=0.5, min_p=0.1, max_tokens=24, ignore_eos=True)),
    ]
    prompts = [p for p, _ in others[:2]] + [prompt] + [p for p, _ in others[2:]] + [prompt]
    params = [s for _, s in others[:2]] + [seeded] + [s for _, s in others[2:]] + [seeded]

    in_batch = _completions(_llm(tiny_path), prompts, params)
    assert in_batch[2] == alone and in_batch[-1] == alone

    chunked = _completions(_llm(tiny_path, max_num_batched_tokens=24), prompts, params)
    assert chunked[2] == alone and chunked[-1] == alone

    # 10 blocks of 16 tokens: every request fits alone (the largest needs 8), not all together
    engine = _llm(tiny_path, num_kv_blocks=10).engine
    for i, (p, s) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, s)
    preempted: dict[str, list[int]] = {}
    num_preemptions = {"2": 0, "6": 0}  # of the two seeded copies
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                preempted[output.request_id] = output.outputs[0].token_ids
        for request_id in num_preemptions:
            request = engine.scheduler.get(request_id)
            if request is not None:
                num_preemptions[request_id] = request.num_preemptions
    assert max(num_preemptions.values()) > 0  # a seeded copy was preempted and recomputed
    assert preempted["2"] == alone and preempted["6"] == alone

    other_seed = _completions(_llm(tiny_path), [prompt], SamplingParams(seed=1235, temperature=0.9, max_tokens=24,
                                                                       ignore_eos=True))[0]
    assert sum(a != b for a, b in zip(alone, other_seed)) > 12


def test_unseeded_sampling_follows_the_engine_seed_not_the_global_rng(tiny_path):
    import torch

    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    first = _completions(_llm(tiny_path, seed=3), [_prompt(9)], params)
    torch.manual_seed(999)
    torch.rand(1000)  # whatever the user's own code draws
    llm = _llm(tiny_path, seed=3)
    state = torch.get_rng_state()
    assert _completions(llm, [_prompt(9)], params) == first
    assert torch.equal(torch.get_rng_state(), state)  # and the engine drew nothing from the global RNG
    assert _completions(_llm(tiny_path, seed=4), [_prompt(9)], params) != first


def test_top_k_1_equals_greedy_through_the_engine(tiny_path):
    llm = _llm(tiny_path)
    prompts = [_prompt(n, n) for n in (4, 19, 66)]
    greedy = _completions(llm, prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for params in (SamplingParams(top_k=1, temperature=1.3, max_tokens=16, ignore_eos=True),
                   SamplingParams(top_k=1, temperature=0.7, seed=5, top_p=0.5, max_tokens=16, ignore_eos=True)):
        assert _completions(llm, prompts, params) == greedy
    sampled = _completions(llm, prompts, SamplingParams(temperature=1.3, seed=5, max_tokens=16, ignore_eos=True))
    assert sampled != greedy


def test_stop_token_ids_and_max_tokens_end_generation(tiny_path):
    llm = _llm(tiny_path)
    prompt = _prompt(9)
    params = SamplingParams(seed=21, temperature=1.0, max_tokens=16, ignore_eos=True)
    full = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert full.finish_reason == "length" and full.stop_reason is None and len(full.token_ids) == 16
    # the first token that did not occur before it, from the third on, becomes the stop id
    k = next(i for i in range(2, 16) if full.token_ids[i] not in full.token_ids[:i])
    stop_id = full.token_ids[k]
    stopped = llm.generate([prompt], SamplingParams(seed=21, temperature=1.0, max_tokens=16, ignore_eos=True,
                                                    stop_token_ids=[stop_id, 383]), use_tqdm=False)[0].outputs[0]
    assert stopped.token_ids == full.token_ids[: k + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id


def test_eos_ends_generation_unless_min_tokens_or_ignore_eos(tiny_path, tmp_path):
    prompt = _prompt(5)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    first = _completions(_llm(tiny_path), [prompt], greedy)[0][0]
    # the same random weights, with the greedy first token declared the end-of-sequence token
    llm = _llm(str(make_tiny_checkpoint("qwen3", tmp_path, eos_token_id=first)))
    ended = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    assert ended.token_ids == [first] and ended.finish_reason == "stop" and ended.stop_reason is None

    later = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, min_tokens=4),
                         use_tqdm=False)[0].outputs[0]
    assert first not in later.token_ids[:4] and len(later.token_ids) >= 5
    assert later.finish_reason == "length" or later.token_ids[-1] == first

    ignored = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    assert ignored.token_ids[0] == first and len(ignored.token_ids) == 6 and ignored.finish_reason == "length"


def test_min_tokens_holds_back_stop_token_ids(tiny_path):
    llm = _llm(tiny_path)
    stops = list(range(0, 300))  # most of the vocabulary: without min_tokens, generation ends at once
    prompts = [_prompt(8 + i, i) for i in range(6)]
    free = llm.generate(prompts, [SamplingParams(seed=s, temperature=1.0, max_tokens=12, stop_token_ids=stops)
                                  for s in range(6)], use_tqdm=False)
    assert any(len(o.outputs[0].token_ids) < 4 for o in free)
    held = llm.generate(prompts, [SamplingParams(seed=s, temperature=1.0, max_tokens=12, stop_token_ids=stops,
                                                 min_tokens=4) for s in range(6)], use_tqdm=False)
    eos = llm.engine.eos_token_ids
    lengths = []
    for output in held:
        completion = output.outputs[0]
        body = completion.token_ids[:4]
        assert len(body) == 4 and not set(body) & (set(stops) | eos), completion.token_ids
        if completion.finish_reason == "stop":
            assert completion.stop_reason == completion.token_ids[-1] and completion.stop_reason in stops
        lengths.append(len(completion.token_ids))
    assert 5 in lengths  # the stop ids come back right after min_tokens


def test_logprobs_through_the_engine_match_hf(tiny_path):
    from transformers import AutoModelForCausalLM

    prompt, top_n = _prompt(12), 4
    llm = _llm(tiny_path)
    outputs = llm.generate([prompt, prompt], [SamplingParams(temperature=0, max_tokens=8, logprobs=top_n),
                                              SamplingParams(temperature=1.0, seed=3, max_tokens=8, logprobs=top_n)],
                           use_tqdm=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    num_outside_top = 0
    for output in outputs:
        completion = output.outputs[0]
        ids = torch.tensor([prompt + completion.token_ids[:-1]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:].double()
        reference = torch.log_softmax(logits, dim=-1)
        assert len(completion.logprobs) == len(completion.token_ids)
        for position, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
            ref = reference[position]
            assert next(iter(entry)) == token  # the sampled token comes first
            sampled = entry[token]
            assert sampled.logprob == pytest.approx(ref[token].item(), abs=1e-4)
            lowest = int((ref > ref[token] + 1e-4).sum()) + 1
            highest = int((ref > ref[token] - 1e-4).sum()) + 1
            assert lowest <= sampled.rank <= highest
            top = sorted((lp for lp in entry.values() if lp.rank <= top_n), key=lambda lp: lp.rank)
            assert [lp.rank for lp in top] == list(range(1, top_n + 1))
            assert [lp.logprob for lp in top] == pytest.approx(ref.topk(top_n).values.tolist(), abs=1e-4)
            assert len(entry) == top_n + (sampled.rank > top_n)
            num_outside_top += sampled.rank > top_n
    assert outputs[0].outputs[0].logprobs[0][outputs[0].outputs[0].token_ids[0]].rank == 1
    assert num_outside_top > 0  # the sampled request drew tokens outside the top-N


def test_n_completions_have_distinct_seeds_and_indexes(tiny_path):
    llm = _llm(tiny_path)
    prompt = _prompt(10)
    params = SamplingParams(n=3, seed=500, temperature=0.9, max_tokens=12, ignore_eos=True)
    output = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.index for c in output.outputs] == [0, 1, 2]
    completions = [c.token_ids for c in output.outputs]
    assert len({tuple(c) for c in completions}) == 3
    # completion i is the request with seed + i: reproducible one by one
    singles = _completions(llm, [prompt] * 3, [SamplingParams(seed=500 + i, temperature=0.9, max_tokens=12,
                                                              ignore_eos=True) for i in range(3)])
    assert completions == singles
    unseeded = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, max_tokens=12, ignore_eos=True),
                            use_tqdm=False)[0]
    assert len({tuple(c.token_ids) for c in unseeded.outputs}) == 4


def test_streamed_n_completions_carry_their_own_deltas(tiny_path):
    """Outputs kept from earlier steps must still show those steps' deltas (not the latest)."""
    engine = _llm(tiny_path).engine
    engine.add_request("req", _prompt(7), SamplingParams(n=2, seed=8, temperature=1.0, max_tokens=6,
                                                         ignore_eos=True))
    engine.add_request("other", _prompt(20), SamplingParams(max_tokens=3, ignore_eos=True))
    steps = []
    while engine.has_unfinished_requests():
        steps.extend(o for o in engine.step() if o.request_id == "req")
    final = steps[-1]
    assert final.finished and not any(o.finished for o in steps[:-1])
    for index in range(2):
        deltas = [step.outputs[index].delta_token_ids for step in steps]
        assert [t for d in deltas for t in d] == final.outputs[index].token_ids
        assert all(len(d) == 1 for d in deltas)
        assert [len(step.outputs[index].token_ids) for step in steps] == list(range(1, 7))
