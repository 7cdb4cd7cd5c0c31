"""A stream read late gets its outputs coalesced into one: the same text, token ids and count as read step by step."""

from __future__ import annotations

import asyncio

import pytest

from infer_core.engine.core_messages import RemoteRequest
from infer_core.engine.output_processor import OutputProcessor
from infer_core.engine.request_stream import RequestStream
from infer_core.interfaces import RequestStatus, RequestUpdate
from infer_core.sampling_params import SamplingParams
from infer_core.testing import write_word_tokenizer

STEPS = [[5, 6], [7], [], [8, 9, 10], [11]]  # a step may bring no token (a held-back step) or several (speculative)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(write_word_tokenizer(tmp_path_factory.mktemp("words"))))


def _outputs(tokenizer, n: int):
    """Each step's RequestOutput of one request of ``n`` completions; completion 1 skips the second step."""
    processor = OutputProcessor(tokenizer)
    children = [(f"r-{i}", SamplingParams(max_tokens=100)) for i in range(n)]
    processor.add("r", None, [1, 2, 3], children, 0.0)
    requests = {cid: RemoteRequest(cid) for cid, _ in children}
    outputs = []
    for step, tokens in enumerate(STEPS):
        last = step == len(STEPS) - 1
        updates = []
        for i, (cid, _) in enumerate(children):
            if i == 1 and step == 1:
                continue
            if last:
                requests[cid].status = RequestStatus.FINISHED_LENGTH
            updates.append(RequestUpdate(requests[cid], [t + i for t in tokens], None, last))
        outputs.extend(processor.process(updates)[0])
    return outputs


async def _read(stream: RequestStream):
    return [output async for output in stream]


@pytest.mark.parametrize("n", [1, 2])
def test_outputs_put_before_a_read_come_as_one_with_every_delta(tokenizer, n):
    outputs = _outputs(tokenizer, n)
    step_by_step = outputs  # what a reader that keeps up gets: one output per step
    late = RequestStream("r")
    for output in outputs:  # a reader that is behind: every step queued before it reads
        late.put(output)
    (coalesced,) = asyncio.run(_read(late))
    assert coalesced.finished
    for index in range(n):
        deltas = [c for o in step_by_step for c in o.outputs if c.index == index]
        merged = next(c for c in coalesced.outputs if c.index == index)
        assert merged.delta_text == "".join(c.delta_text for c in deltas) == merged.text
        assert merged.delta_token_ids == [t for c in deltas for t in c.delta_token_ids] == merged.token_ids
        expected = [t + index for step, tokens in enumerate(STEPS) if not (index == 1 and step == 1) for t in tokens]
        assert merged.token_ids == expected  # and so the usage a client is told
        assert merged.text.split() == [f"w{t}" for t in expected]
        assert merged.finish_reason == "length"


def test_a_reader_in_between_gets_the_rest_coalesced(tokenizer):
    outputs = _outputs(tokenizer, 1)
    stream = RequestStream("r")
    stream.put(outputs[0])

    async def read_two():
        iterator = stream.__aiter__()
        first = await iterator.__anext__()
        for output in outputs[1:]:
            stream.put(output)
        return first, [o async for o in iterator]

    first, rest = asyncio.run(read_two())
    assert len(rest) == 1
    assert first.outputs[0].delta_text + rest[0].outputs[0].delta_text == rest[0].outputs[0].text
