"""The ``priority`` scheduler on a tiny model: lower priority values run first, and an urgent request
preempts its way into a full batch instead of waiting for a slot."""

from __future__ import annotations

import pytest

from infer_core import LLM, SamplingParams

PROMPT = [5, 17, 29, 41, 53, 65, 77]
LONG = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("llama"))


def _first_token_before_any_finishes(llm: LLM) -> bool:
    """16 priority-10 requests fill the batch; a priority-0 one arrives: does it get a token before any ends?"""
    engine = llm.engine
    for i in range(16):
        engine.add_request(f"low-{i}", PROMPT, LONG, priority=10)
    for _ in range(3):
        engine.step()
    assert engine.stats().num_running == 16
    engine.add_request("urgent", PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), priority=0)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == "urgent" and output.outputs[0].token_ids:
                return True
            if output.finished:
                return False
    raise AssertionError("nothing finished")


def test_an_urgent_request_preempts_into_a_full_batch(path):
    with LLM(path, device="cpu", num_kv_blocks=256, max_num_seqs=16, scheduler="priority") as llm:
        assert _first_token_before_any_finishes(llm)
        assert llm.engine.stats().num_preemptions >= 1
        while llm.engine.has_unfinished_requests():  # the preempted request resumes and completes
            llm.engine.step()
    with LLM(path, device="cpu", num_kv_blocks=256, max_num_seqs=16) as fcfs:  # the control: fcfs makes it wait
        assert not _first_token_before_any_finishes(fcfs)


@pytest.fixture(scope="module")
def one_slot(path):
    """The priority scheduler with one running request at a time."""
    with LLM(path, device="cpu", num_kv_blocks=256, max_num_seqs=1, scheduler="priority") as llm:
        yield llm


def test_waiting_requests_start_in_priority_order(one_slot):
    engine = one_slot.engine
    for name, priority in (("five", 5), ("one", 1), ("three", 3), ("one-later", 1)):
        engine.add_request(name, PROMPT, SamplingParams(temperature=0, max_tokens=2), priority=priority)
    order = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["one", "one-later", "three", "five"]


def test_generate_takes_a_priority_per_prompt(one_slot):
    outputs = one_slot.generate([PROMPT, PROMPT[:3]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False,
                                priority=[2, 1])
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    with pytest.raises(ValueError, match="one per prompt"):
        one_slot.generate([PROMPT], priority=[1, 2], use_tqdm=False)
