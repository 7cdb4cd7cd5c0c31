"""Structured outputs through the engine: a random tiny model with a real (tiny) tokenizer.

A random model writes no JSON on its own (the control test shows it), so every valid document here
is the grammar's doing: the mask on the sampler's logits, the matcher following each request's
tokens (with overlapped scheduling, through the previous step's pending token), in mixed batches,
across preemption, and through a pickled constraint (how tensor-parallel ranks receive it).
"""

from __future__ import annotations

import json
import pickle
import re

import jsonschema_rs
import pytest
import torch

from infer_core import LLM, SamplingParams
from infer_core.errors import RequestError
from infer_core.sampling_params import StructuredOutputs
from infer_core.testing import make_tiny_checkpoint
from infer_core.testing_tokenizer import write_tiny_tokenizer

PERSON = {
    "type": "object",
    "properties": {
        # a pattern, not maxLength: xgrammar's length-bounded strings let control characters through
        "name": {"type": "string", "pattern": "[A-Za-z ]{1,6}"},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Ada", "The quick brown fox", "0123", "yes no maybe", "Paris", "{", "lazy dog", "London"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    folder = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("tiny-grammar"))
    return str(write_tiny_tokenizer(folder))


@pytest.fixture(scope="module")
def llm(model_path):
    with LLM(model_path, device="cpu", num_kv_blocks=256) as engine:
        yield engine


def _params(seed: int, spec: StructuredOutputs | None, **overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "seed": seed, "max_tokens": 96, "structured_outputs": spec,
                             **overrides})


def _texts(llm: LLM, prompts, params) -> list[str]:
    return [c.text for o in llm.generate(prompts, params, use_tqdm=False) for c in o.outputs]


def test_json_schema_outputs_validate(llm):
    spec = StructuredOutputs(json=PERSON)
    outputs = llm.generate(PROMPTS[:4], [_params(i, spec, n=2) for i in range(4)], use_tqdm=False)
    validator = jsonschema_rs.validator_for(PERSON)
    for output in outputs:
        for completion in output.outputs:
            assert completion.finish_reason == "stop", completion.text
            validator.validate(json.loads(completion.text))


def test_without_the_grammar_the_model_writes_no_json(llm):
    """The control: the same requests unconstrained give nothing that parses."""
    def parses(text: str) -> bool:
        try:
            json.loads(text)
        except ValueError:
            return False
        return True

    texts = _texts(llm, PROMPTS[:4], [_params(i, None, max_tokens=48) for i in range(4)])
    assert not any(parses(t) for t in texts), texts


@pytest.mark.parametrize("spec, check", [
    (StructuredOutputs(regex=r"[a-c]{2}-\d{3}"), lambda t: re.fullmatch(r"[a-c]{2}-\d{3}", t)),
    (StructuredOutputs(choice=["yes", "no", "maybe"]), lambda t: t in ("yes", "no", "maybe")),
    (StructuredOutputs(grammar='root ::= "(" ("ab" | "cd")+ ")"'), lambda t: re.fullmatch(r"\((ab|cd)+\)", t)),
], ids=["regex", "choice", "grammar"])
def test_each_kind_of_constraint(llm, spec, check):
    texts = _texts(llm, PROMPTS[:4], [_params(10 + i, spec, max_tokens=200) for i in range(4)])
    assert all(check(t) for t in texts), texts


def test_json_object_outputs_follow_the_grammar_to_their_end(llm):
    """Any JSON object: a random model may still be inside a string when max_tokens ends it, so each output
    is replayed through a fresh matcher (every token allowed), and those that stopped must parse."""
    spec = StructuredOutputs(json_object=True)
    outputs = llm.generate(PROMPTS[:4], [_params(20 + i, spec, max_tokens=120) for i in range(4)], use_tqdm=False)
    constraint = llm.engine.core.constraints.compile(spec)
    for output in outputs:
        completion = output.outputs[0]
        matcher = constraint.matcher()
        assert all(matcher.accept(t) for t in completion.token_ids), completion.text
        assert completion.text.lstrip().startswith("{")
        if completion.finish_reason == "stop":
            assert isinstance(json.loads(completion.text), dict)


def test_constrained_and_free_requests_share_batches(llm):
    spec = StructuredOutputs(json=PERSON)
    params = [_params(i, spec) if i % 2 else _params(i, None, ignore_eos=True, max_tokens=48) for i in range(8)]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    validator = jsonschema_rs.validator_for(PERSON)
    for i, output in enumerate(outputs):
        text = output.outputs[0].text
        if i % 2:
            validator.validate(json.loads(text))
        else:
            assert len(output.outputs[0].token_ids) == 48  # the free ones ran alongside to their end


def test_greedy_and_stepwise_scheduling(model_path):
    """Greedy rows (the argmax path) and an engine that waits for each step's tokens (no pending tokens)."""
    spec = StructuredOutputs(json=PERSON)
    validator = jsonschema_rs.validator_for(PERSON)
    with LLM(model_path, device="cpu", num_kv_blocks=256, async_scheduling=False) as stepwise:
        texts = _texts(stepwise, PROMPTS[:4], SamplingParams(temperature=0, max_tokens=96, structured_outputs=spec))
    for text in texts:
        validator.validate(json.loads(text))


def test_preempted_requests_resume_in_their_grammar(model_path):
    """A KV pool too small for every request at once: preempted requests come back with a fresh matcher
    that catches up on the tokens they kept."""
    spec = StructuredOutputs(json=PERSON)
    with LLM(model_path, device="cpu", num_kv_blocks=12, max_num_seqs=8) as small:
        outputs = small.generate(PROMPTS, [_params(30 + i, spec) for i in range(8)], use_tqdm=False)
        assert small.engine.stats().num_preemptions > 0
    validator = jsonschema_rs.validator_for(PERSON)
    for output in outputs:
        validator.validate(json.loads(output.outputs[0].text))


def test_a_spec_that_does_not_compile_is_a_request_error(llm):
    with pytest.raises(RequestError, match="regular expression cannot be compiled") as raised:
        llm.generate(["x"], SamplingParams(structured_outputs=StructuredOutputs(regex="(ab")), use_tqdm=False)
    assert raised.value.param == "structured_outputs"
    # nothing of it is left (a step launched for an earlier request may still be in flight: overlapped scheduling)
    assert not llm.engine.outputs.parents and llm.engine.scheduler.num_unfinished == 0


def test_a_pickled_constraint_masks_alike(llm):
    """Tensor-parallel ranks receive the constraint pickled with the request: its matchers allow the same tokens."""
    constraint = llm.engine.core.constraints.compile(StructuredOutputs(json=PERSON))
    copy = pickle.loads(pickle.dumps(constraint))
    tokens = llm.get_tokenizer().encode('{"name": "Ada", "age": 3', add_special_tokens=False)
    words = -(-llm.engine.config.model.vocab_size // 32)
    masks = []
    for c in (constraint, copy):
        matcher = c.matcher()
        assert all(matcher.accept(t) for t in tokens)
        bitmask = torch.zeros((1, words), dtype=torch.int32)
        matcher.fill_bitmask(bitmask, 0)
        masks.append(bitmask)
    assert torch.equal(masks[0], masks[1]) and masks[0].any()


def test_speculative_decoding_refuses_structured_outputs(model_path):
    """Drafts are verified without the grammar's mask: a constrained request is a RequestError, not free text."""
    pytest.importorskip("infer_spec_decode")
    with LLM(model_path, device="cpu", num_kv_blocks=32, decoding="ngram", num_speculative_tokens=2) as drafting:
        with pytest.raises(RequestError, match="speculative decoding") as raised:
            drafting.generate(["x"], _params(1, StructuredOutputs(regex="[ab]+")), use_tqdm=False)
        assert raised.value.param == "structured_outputs" and not drafting.engine.has_unfinished_requests()
