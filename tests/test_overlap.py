"""Overlapped scheduling (``async_scheduling``): step N+1 is planned and launched before step N's
tokens are read, and it must change nothing a user can see.

Every check runs the same requests through an engine with overlap and one without, on a tiny real
checkpoint, and compares tokens, finish reasons and logprobs: sampling features that read the
history (penalties, min_tokens, seeded positions), stops found one step late, preemption,
chunked prefill, prefix caching and aborts.
"""

from __future__ import annotations

import pytest

from infer_core import LLM, SamplingParams
from infer_core.builtin.kv_paged import PagedKVAllocator
from infer_core.builtin.scheduler_fcfs import FCFSScheduler
from infer_core.interfaces import Request, RunnerOutput, SchedulerConfig


def _prompt(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % 380 + 3 for i in range(length)]


@pytest.fixture(scope="module")
def tiny_path(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("qwen3"))


def _engine(path: str, overlap: bool, **settings):
    llm = LLM(path, **{"num_kv_blocks": 256, "async_scheduling": overlap, **settings})
    assert llm.engine.overlap is overlap
    return llm


def _run(llm: LLM, prompts, params):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [[(c.token_ids, c.finish_reason, c.stop_reason, c.logprobs) for c in o.outputs] for o in outputs]


def _same(a, b) -> None:
    assert len(a) == len(b)
    for request_a, request_b in zip(a, b):
        for (ids_a, reason_a, stop_a, lp_a), (ids_b, reason_b, stop_b, lp_b) in zip(request_a, request_b):
            assert (ids_a, reason_a, stop_a) == (ids_b, reason_b, stop_b)
            if lp_a is not None:
                for step_a, step_b in zip(lp_a, lp_b, strict=True):
                    assert step_a.keys() == step_b.keys()
                    for token in step_a:
                        assert step_a[token].logprob == pytest.approx(step_b[token].logprob, abs=1e-5)


MIXED = [
    (_prompt(17), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)),
    (_prompt(5, 11), SamplingParams(seed=7, temperature=0.9, top_k=20, top_p=0.9, max_tokens=25, ignore_eos=True)),
    (_prompt(40, 5), SamplingParams(seed=3, temperature=1.0, presence_penalty=1.5, frequency_penalty=0.7,
                                    repetition_penalty=1.3, max_tokens=28, ignore_eos=True)),
    (_prompt(9, 2), SamplingParams(temperature=0, repetition_penalty=2.0, max_tokens=20, ignore_eos=True)),
    (_prompt(23, 8), SamplingParams(seed=11, temperature=0.7, min_p=0.05, max_tokens=1, ignore_eos=True)),
    (_prompt(31, 4), SamplingParams(seed=5, temperature=0.8, n=2, max_tokens=12, logprobs=3, ignore_eos=True)),
    (_prompt(12, 6), SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)),
]


@pytest.mark.parametrize("settings", [
    {},
    {"max_num_batched_tokens": 24},  # chunked prefill next to decodes
    {"num_kv_blocks": 12},  # preemption by recompute
    {"enable_prefix_caching": False, "max_num_seqs": 3},
], ids=["plain", "chunked", "preempting", "no-prefix-cache"])
def test_overlap_gives_the_tokens_of_stepping_in_lockstep(tiny_path, settings):
    prompts, params = [p for p, _ in MIXED], [s for _, s in MIXED]
    expected = _run(_engine(tiny_path, False, **settings), prompts, params)
    _same(_run(_engine(tiny_path, True, **settings), prompts, params), expected)
    assert [len(c[0]) for r in expected for c in r] == [30, 25, 28, 20, 1, 12, 12, 16]


def test_stops_found_a_step_late_drop_the_extra_token(tiny_path):
    """A stop token, a stop at min_tokens' edge and EOS end requests with the lockstep tokens."""
    free = _run(_engine(tiny_path, False), [_prompt(20), _prompt(14, 9)],
                [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)] * 2)
    first, second = free[0][0][0], free[1][0][0]
    params = [
        SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[first[6]]),
        SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[second[2]], min_tokens=min(8, len(second))),
        SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[first[0]], include_stop_str_in_output=True),
    ]
    prompts = [_prompt(20), _prompt(14, 9), _prompt(20)]
    expected = _run(_engine(tiny_path, False), prompts, params)
    _same(_run(_engine(tiny_path, True), prompts, params), expected)
    assert expected[0][0][1] == "stop" and len(expected[0][0][0]) <= 7
    assert expected[2][0][0] == [first[0]]


def test_the_next_step_is_planned_before_the_previous_tokens_are_read(tiny_path):
    """Overlap really happens: steps carry pending tokens, and a step's result is read one call later."""
    llm = _engine(tiny_path, True)
    engine = llm.engine
    plans = []
    launch = engine.executor.execute_async

    def observed(scheduler_output):
        plans.append(scheduler_output)
        return launch(scheduler_output)

    engine.executor.execute_async = observed
    engine.add_request("a", _prompt(10), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert engine.step() == []  # the prefill is launched; nothing has come back yet
    tokens = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens += output.outputs[0].token_ids if output.finished else []
    assert len(tokens) == 6
    pending = [c.num_pending_tokens for plan in plans for c in plan.cached_requests]
    assert pending == [1] * 5  # every decode's input token was still on the device when it was planned
    assert engine.scheduler.stats().kv_usage == 0


def test_abort_while_a_step_is_in_flight(tiny_path):
    llm = _engine(tiny_path, True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request("keep", _prompt(15), params)
    engine.add_request("drop", _prompt(11, 7), params)
    for _ in range(4):
        engine.step()
    aborted = engine.abort("drop")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    # the id is free at once, though a step that ran the aborted request is still in flight
    engine.add_request("drop", _prompt(9, 2), params)
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
    lockstep = _engine(tiny_path, False)
    expected = {"keep": _run(lockstep, [_prompt(15)], params)[0][0][0],
                "drop": _run(lockstep, [_prompt(9, 2)], params)[0][0][0]}
    assert finished == expected
    assert engine.scheduler.stats().kv_usage == 0


def _decode_request(max_tokens: int) -> Request:
    return Request("r", [5, 6, 7], SamplingParams(max_tokens=max_tokens), max_tokens, frozenset({2}))


def test_scheduler_counts_the_in_flight_step():
    """Planning twice before a result: the second plan decodes the pending token, never past max_tokens."""
    scheduler = FCFSScheduler(SchedulerConfig(4, 64, 100), PagedKVAllocator(16, 4, False))
    request = _decode_request(max_tokens=2)
    scheduler.add(request)
    prefill = scheduler.schedule()
    assert prefill.num_scheduled_tokens == {"r": 3} and request.num_pending_tokens == 1
    decode = scheduler.schedule()  # the prefill's token is not back yet
    (cached,) = decode.cached_requests
    assert (cached.num_computed_tokens, cached.num_pending_tokens, cached.new_token_ids) == (3, 1, [])
    assert request.num_inflight_tokens == 4 and request.num_pending_tokens == 2
    assert scheduler.schedule().is_empty  # its second token is its last: nothing more to plan
    scheduler.update(prefill, RunnerOutput(["r"], [[9]], [None]), {"r": [9]})
    assert (request.num_computed_tokens, request.num_inflight_tokens, request.num_pending_tokens) == (3, 1, 1)
    assert scheduler.schedule().is_empty
    (update,) = scheduler.update(decode, RunnerOutput(["r"], [[8]], [None]), {"r": [8]})
    assert update.finished and request.output_token_ids == [9, 8] and request.num_computed_tokens == 4


def test_scheduler_counts_a_verify_step_in_flight_as_keeping_every_draft():
    """A verify step of k drafts counts k+1 pending tokens; the next plan starts after them and its drafts never
    pass max_tokens; the rejected drafts are taken back when the verify step is read; and a request whose pending
    tokens reach max_tokens is not planned again, drafts or not."""
    scheduler = FCFSScheduler(SchedulerConfig(4, 64, 100, num_lookahead_tokens=3), PagedKVAllocator(16, 4, False))
    request = _decode_request(max_tokens=8)
    scheduler.add(request)
    prefill = scheduler.schedule()
    scheduler.update(prefill, RunnerOutput(["r"], [[9]], [None]), {"r": [9]})  # prompt 5 6 7, then 9
    request.spec_token_ids = [10, 11, 12]
    verify = scheduler.schedule()
    assert verify.num_scheduled_tokens == {"r": 4} and verify.spec_token_ids == {"r": [10, 11, 12]}
    assert request.num_pending_tokens == 4  # as if 10, 11, 12 and the token after them were kept
    request.spec_token_ids = [13, 14, 15]
    after = scheduler.schedule()  # the verify step is not back yet
    (cached,) = after.cached_requests
    assert (cached.num_computed_tokens, cached.num_pending_tokens) == (7, 4)  # from position 7 = 3 + 4
    assert after.spec_token_ids == {"r": [13, 14]}  # 1 + 4 + 2 drafts + 1 = max_tokens 8
    assert request.num_pending_tokens == 4 + 3
    request.spec_token_ids = [16]
    assert scheduler.schedule().is_empty  # its pending tokens reach max_tokens: not planned, though it drafted
    # the verify step kept 10 and rejected 11 (the target's token there is 20): positions 3 and 4 (9, 10) computed,
    # 5 and 6 taken back; the step planned over it (1 + 2 drafts) is still in flight
    scheduler.update(verify, RunnerOutput(["r"], [[10, 20, 0, 0]], [None]), {"r": [10, 20]})
    assert (request.num_computed_tokens, request.num_inflight_tokens, request.num_pending_tokens) == (5, 3, 3)
    assert request.output_token_ids == [9, 10, 20]


@pytest.mark.gpu
def test_host_slots_are_reused_once_read_and_replaced_while_unread():
    """The pinned buffers for sampled ids (runner/step_output.py): a step's ids land in its slot; a slot is
    taken again only after its step was read, and a slot still unread is left to that step."""
    import torch

    from infer_core.layers.sampler import SamplerOutput
    from infer_core.runner.state import RequestState
    from infer_core.runner.step_output import HostSlots, SampledStep

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    slots = HostSlots(max_rows=4, stream=torch.cuda.current_stream(), num_slots=2)
    states = [RequestState(rid, [1], 1, SamplingParams(), [], 1) for rid in ("a", "b")]
    steps = []
    for i in range(4):
        ids = torch.tensor([10 * i, 10 * i + 1], device="cuda")
        steps.append(SampledStep(["a", "b"], [0, 1], states, SamplerOutput(ids), slot=slots.take(2)))
        assert steps[-1].result().sampled_token_ids == [[10 * i], [10 * i + 1]]
    assert steps[0].slot is steps[2].slot and steps[1].slot is steps[3].slot  # round-robin, each read in time
    unread = SampledStep(["a"], [0], states[:1], SamplerOutput(torch.tensor([7], device="cuda")), slot=slots.take(1))
    slots.take(1)  # the other slot
    replacement = slots.take(1)  # unread's turn again: it still holds that step's ids
    assert replacement is not unread.slot and unread.result().sampled_token_ids == [[7]]
    assert slots.take(5) is None  # more rows than a slot holds: the step gets its own buffer
