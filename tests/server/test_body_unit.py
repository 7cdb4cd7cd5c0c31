"""The body decoder, the field-name check and the prompt's character bound, without a server."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from infer_core.server.body import MAX_DEPTH, check_content_type, decode_object, nesting_depth
from infer_core.server.errors import OpenAIError
from infer_core.server.prompt_bound import check_text, derive_char_bound
from infer_core.server.schemas import ChatCompletionRequest, CompletionRequest
from infer_core.server.validation import validate

CORPUS = ["the quick brown fox jumps over the lazy dog", "café naïve résumé", "hello world " * 20,
          "def f(x):\n    return x + 1\n", "1234567890 " * 10, "日本語のテキスト", "=" * 64]


def _tokenizer(normalizer=None, pre_tokenizer=None, added: list[AddedToken] | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's design) trained on a few lines, optionally with a normalizer or other steps."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if added:
        tok.add_tokens(added)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def byte_bpe() -> PreTrainedTokenizerFast:
    return _tokenizer()


# the body ------------------------------------------------------------------------------------------

def _status(call) -> tuple[int, str]:
    with pytest.raises(OpenAIError) as e:
        call()
    return e.value.status, e.value.message


def test_nesting_is_counted_outside_strings_only():
    assert nesting_depth(b'{"a": [[1], {"b": "[[[[{{{{"}]}') == 3
    assert nesting_depth(b'{"a": "\\"[[[[", "b": [1]}') == 2
    assert nesting_depth(b"1") == 0


def test_deep_nesting_is_400_before_the_parser_recurses():
    for deep in ("[" * 100_000 + "]" * 100_000, '{"a":' * 5000 + "1" + "}" * 5000):
        status, message = _status(lambda deep=deep: decode_object(f'{{"x": {deep}}}'.encode()))
        assert status == 400 and "levels deep" in message
    shallow = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert decode_object(f'{{"x": {shallow}}}'.encode())["x"]


def test_encodings_and_shapes():
    assert decode_object(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    assert decode_object(b'{"a": "\\ud83d\\ude00 \\\\ud800"}') == {"a": "\U0001f600 \\ud800"}
    for raw in ('{"a": 1}'.encode("utf-16"), '{"a": 1}'.encode("utf-16-be"), b'{"a": "\xff"}',
                b'{"a": "\\udc00"}', b'{"a": 1, "a": 2}', b"[]", b"", b'{"a": Infinity}', b'{"a": 1e5}x'):
        status, _ = _status(lambda raw=raw: decode_object(raw))
        assert status == 400, raw


def test_content_types():
    for ok in (None, "", "application/json", "Application/JSON; charset=utf-8", "application/problem+json"):
        check_content_type(ok)
    for bad in ("text/plain", "application/json; charset=utf-16", "multipart/form-data; boundary=x"):
        status, message = _status(lambda bad=bad: check_content_type(bad))
        assert status == 415 and "application/json" in message


# the fields ----------------------------------------------------------------------------------------

def test_a_near_miss_of_a_field_name_is_400_naming_it():
    for body, param, known in [({"prompt": "x", "max_token": 1}, "max_token", "max_tokens"),
                               ({"prompt": "x", "maxTokens": 1}, "maxTokens", "max_tokens"),
                               ({"prompt": "x", "temprature": 1}, "temprature", "temperature")]:
        with pytest.raises(OpenAIError) as e:
            validate(CompletionRequest, body)
        assert e.value.param == param and f"did you mean {known!r}" in e.value.message
    with pytest.raises(OpenAIError) as e:
        validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x", "tool_call_ids": "1"}]})
    assert e.value.param == "messages.0.tool_call_ids"
    body = validate(CompletionRequest, {"prompt": "x", "store": True, "vendor": {"max_tokens": 1}})
    assert body.max_tokens == 16  # unknown fields stay ignored, as before
    # a field of the chat route sent to completions is not a misspelling of one of its own
    validate(CompletionRequest, {"prompt": "x", "top_logprobs": None, "add_generation_prompt": None, "messages": []})


def test_a_wrong_value_names_the_field_and_the_value():
    with pytest.raises(OpenAIError) as e:
        validate(CompletionRequest, {"prompt": "x", "temperature": 10**400})
    assert e.value.param == "temperature" and "401 digits" in e.value.message
    with pytest.raises(OpenAIError) as e:
        validate(CompletionRequest, {"prompt": ["a", 1]})
    assert e.value.param and e.value.param.startswith("prompt")


def test_integers_are_what_json_schema_calls_integers():
    body = validate(CompletionRequest, {"prompt": [1.0, 2], "max_tokens": 3.0, "seed": 1e20})
    assert body.prompts() == [[1, 2]] and body.max_tokens == 3 and body.seed == 10**20
    assert all(type(t) is int for t in body.prompts()[0])
    for value in (2.5, True, "2", float("inf")):
        with pytest.raises(OpenAIError) as e:
            validate(CompletionRequest, {"prompt": "x", "max_tokens": value})
        assert e.value.param == "max_tokens"
    schema = CompletionRequest.model_json_schema()["properties"]
    assert schema["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1}
    assert schema["logprobs"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 20}


# the prompt's bound --------------------------------------------------------------------------------

def test_a_byte_level_bpe_has_a_bound(byte_bpe):
    bound = derive_char_bound(byte_bpe)
    assert bound is not None and bound.normal_form is None
    assert bound.chars_per_token == max(len(t) for t in byte_bpe.get_vocab())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(max_size=300) | st.sampled_from(CORPUS).map(lambda s: s * 7))
def test_the_bound_never_exceeds_the_real_token_count(byte_bpe, text):
    bound = derive_char_bound(byte_bpe)
    tokens = len(byte_bpe.encode(text, add_special_tokens=False))
    assert tokens * bound.chars_per_token >= len(text)


def test_check_text_refuses_only_what_cannot_fit(byte_bpe):
    per_token = derive_char_bound(byte_bpe).chars_per_token
    check_text(byte_bpe, "x" * (10 * per_token), 11, "your prompt is", "prompt")  # may fit: tokenize and see
    with pytest.raises(OpenAIError) as e:
        check_text(byte_bpe, "x" * (10 * per_token + 1), 11, "your prompt is", "prompt")
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    assert f"{10 * per_token + 1:,} characters" in e.value.message and "at least 11 tokens" in e.value.message
    check_text(byte_bpe, "x" * 10**6, 0, "your prompt is", "prompt")  # no known context: no bound


def test_composing_normalizers_are_measured_after_composing():
    tok = _tokenizer(normalizer=normalizers.NFC())
    bound = derive_char_bound(tok)
    assert bound is not None and bound.normal_form == "NFC"
    decomposed = "e\u0301" * (4 * bound.chars_per_token)  # 8 L characters, 4 L after NFC: at least 4 tokens
    check_text(tok, decomposed, 6, "your prompt is", "prompt")  # 5 tokens of room: 8 L raw, but 4 L after NFC
    with pytest.raises(OpenAIError) as e:
        check_text(tok, decomposed, 4, "your prompt is", "prompt")
    assert "after NFC" in e.value.message


@pytest.mark.parametrize("make", [
    lambda: _tokenizer(normalizer=normalizers.Strip()),
    lambda: _tokenizer(normalizer=normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("  ", ""),
                                                        normalizers.Lowercase()])),
    lambda: _tokenizer(pre_tokenizer=pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                              pre_tokenizers.ByteLevel(add_prefix_space=False)])),
    lambda: _tokenizer(added=[AddedToken("<tool>", lstrip=True)]),
])
def test_pipelines_that_can_drop_characters_have_no_bound(make):
    tok = make()
    assert derive_char_bound(tok) is None
    check_text(tok, "x" * 10**6, 8, "your prompt is", "prompt")  # left to the tokenizer's own count


def test_a_body_decodes_back_to_what_was_sent():
    body = {"prompt": [[1, 2, 3]] * 3, "stop": ["\n", "é", "\U0001f600"], "seed": 2**63, "t": 1e-300}
    assert decode_object(json.dumps(body).encode()) == body
    assert decode_object(json.dumps(body, ensure_ascii=False).encode()) == body
