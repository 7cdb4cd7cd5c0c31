"""Every request field of structured outputs, logprobs and priority crosses the pipe to the engine-core
process and is honoured there, and what the core computes for them comes back across it.

One ``AsyncEngine`` (its core in a process of its own) and one in-process ``LLM``, both on a tiny
random model with a real tiny tokenizer and the ``priority`` scheduler with one running slot: the
same seeded requests give the same tokens on both sides (a field dropped on the way would change
them: a random model follows no regex and favours no token on its own), prompt logprobs come back
whole, refusals made in the core (a grammar that does not compile) reach the caller as
``RequestError``, and an urgent request preempts a running one in the core.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from infer_core import LLM, SamplingParams
from infer_core.engine.async_engine import AsyncEngine
from infer_core.engine.engine_state import EngineState
from infer_core.errors import RequestError
from infer_core.sampling_params import StructuredOutputs
from infer_core.settings import load_settings
from infer_core.testing import make_tiny_checkpoint
from infer_core.testing_tokenizer import write_tiny_tokenizer

SETTINGS = {"device": "cpu", "dtype": "float32", "num_kv_blocks": 64, "max_num_seqs": 1, "scheduler": "priority"}
PATTERN = r"(yes|no|maybe) [0-9]{2}"
PROMPT = [5, 17, 29, 41, 53, 65, 77, 89, 101, 113]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    folder = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("tiny-fields"))
    return str(write_tiny_tokenizer(folder))


@pytest.fixture(scope="module")
def both(model_path):
    """(event loop, the AsyncEngine, the in-process LLM) on one checkpoint and one configuration."""
    loop = asyncio.new_event_loop()
    engine = AsyncEngine(load_settings(model=model_path, **SETTINGS))
    engine.start(loop)
    loop.run_until_complete(asyncio.to_thread(engine.loaded.wait, 240))
    assert engine.state is EngineState.READY, engine.error
    try:
        with LLM(model_path, **SETTINGS) as offline:
            yield loop, engine, offline
    finally:
        engine.shutdown()
        loop.close()


async def _final(engine: AsyncEngine, request_id: str, prompt, params: SamplingParams, priority: int = 0):
    last = None
    async for output in await engine.add_request(request_id, prompt, params, priority=priority):
        last = output
    return last


def test_sampling_fields_cross_and_give_what_the_in_process_engine_gives(both):
    loop, engine, offline = both
    cases = {
        "regex": SamplingParams(temperature=1.0, seed=7, max_tokens=16, n=2,
                                structured_outputs=StructuredOutputs(regex=PATTERN)),
        "choice": SamplingParams(temperature=1.0, seed=8, max_tokens=8,
                                 structured_outputs=StructuredOutputs(choice=("Paris", "London"))),
        "bias": SamplingParams(temperature=1.0, seed=9, max_tokens=6, ignore_eos=True, logit_bias={42: 100.0}),
        "scored": SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2, logprobs=1),
        "stop": SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop_token_ids=[3]),
    }
    for name, params in cases.items():
        remote = loop.run_until_complete(_final(engine, name, PROMPT, params))
        local = offline.generate([PROMPT], params, use_tqdm=False)[0]
        assert [c.token_ids for c in remote.outputs] == [c.token_ids for c in local.outputs], name
        assert [c.finish_reason for c in remote.outputs] == [c.finish_reason for c in local.outputs], name
        if name in ("regex", "choice"):
            for completion in remote.outputs:
                assert re.fullmatch(PATTERN if name == "regex" else "Paris|London", completion.text), completion.text
    assert remote.outputs[0].token_ids  # (the last case ran)
    bias = loop.run_until_complete(_final(engine, "bias-again", PROMPT, cases["bias"]))
    assert bias.outputs[0].token_ids == [42] * 6
    scored = loop.run_until_complete(_final(engine, "scored-again", PROMPT, cases["scored"]))
    expected = offline.generate([PROMPT], cases["scored"], use_tqdm=False)[0].prompt_logprobs
    assert len(scored.prompt_logprobs) == len(PROMPT) and scored.prompt_logprobs[0] is None
    for got, want, token in zip(scored.prompt_logprobs[1:], expected[1:], PROMPT[1:]):
        assert got[token].logprob == pytest.approx(want[token].logprob, abs=1e-5) and len(got) >= 2


def test_refusals_made_in_the_core_and_in_the_frontend_reach_the_caller(both):
    loop, engine, _ = both
    bad_regex = SamplingParams(structured_outputs=StructuredOutputs(regex="(ab"))
    with pytest.raises(RequestError, match="regular expression cannot be compiled") as raised:
        loop.run_until_complete(_final(engine, "bad-regex", PROMPT, bad_regex))
    assert raised.value.param == "structured_outputs"
    vocab = engine.config.model.vocab_size
    for field, params in (("stop_token_ids", SamplingParams(stop_token_ids=[vocab])),
                          ("logit_bias", SamplingParams(logit_bias={vocab + 1: 1.0}))):
        with pytest.raises(RequestError, match=f"outside this model's vocabulary \\[0, {vocab}\\)") as raised:
            loop.run_until_complete(_final(engine, f"bad-{field}", PROMPT, params))
        assert raised.value.param == field
    assert engine.num_unfinished == 0


def test_priority_crosses_and_an_urgent_request_preempts_the_running_one(both):
    """One running slot: a long priority-10 request runs; a priority-0 one arrives and finishes first."""
    loop, engine, _ = both
    order: list[str] = []

    async def run() -> None:
        long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
        stream = await engine.add_request("low", PROMPT, long, priority=10)

        async def drain_low() -> None:
            async for output in stream:
                if output.finished:
                    order.append("low")

        low = asyncio.ensure_future(drain_low())
        while not engine.snapshot.num_running:  # the low request holds the only slot
            await asyncio.sleep(0.01)
        urgent = await _final(engine, "urgent", PROMPT, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                              priority=0)
        order.append("urgent")
        assert len(urgent.outputs[0].token_ids) == 2
        await low

    loop.run_until_complete(run())
    assert order == ["urgent", "low"]
    assert engine.snapshot.num_preemptions >= 1
