"""Bad requests get OpenAI's envelope and a 4xx naming the problem; fuzzed bodies never get a 5xx."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Hi"}]


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def test_malformed_json_is_400(http):
    err = _error(http.post("/v1/chat/completions", content=b'{"model": "x", "messages": [',
                           headers={"content-type": "application/json"}), 400)
    assert "JSON" in err["message"]
    _error(http.post("/v1/completions", content=b"[1, 2]", headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": CHAT, "temperature": -1}, "temperature"),
    ({"messages": CHAT, "top_p": 1.5}, "top_p"),
    ({"messages": CHAT, "n": 0}, "n"),
    ({"messages": CHAT, "max_tokens": "many"}, "max_tokens"),
    ({"messages": CHAT, "max_tokens": 0}, "max_tokens"),
    ({"messages": CHAT, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": CHAT, "stream": "yes"}, "stream"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
])
def test_invalid_chat_values_are_400_naming_the_field(http, body, param):
    err = _error(http.post("/v1/chat/completions", json={"model": MODEL, **body}), 400)
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "min_p": 2}, "min_p"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": [], "max_tokens": 4}, "prompt"),
    ({"prompt": [10**9], "max_tokens": 4}, "prompt"),
    ({"prompt": {"a": 1}}, "prompt"),
    ({"prompt": "x", "echo": True, "logprobs": 1, "prompt_logprobs": 99}, "prompt_logprobs"),
])
def test_invalid_completion_values_are_400(http, body, param):
    err = _error(http.post("/v1/completions", json={"model": MODEL, **body}), 400)
    assert err["param"] == param, err


def test_context_length_exceeded(http):
    info = http.post("/tokenize", json={"prompt": "hello " * 50, "add_special_tokens": True}).json()
    limit, prompt_tokens = info["max_model_len"], info["count"]
    err = _error(http.post("/v1/completions", json={"model": MODEL, "prompt": "hello " * 50, "max_tokens": limit}),
                 400)
    assert err["code"] == "context_length_exceeded"
    assert err["message"].startswith(
        f"This model's maximum context length is {limit} tokens. However, you requested {prompt_tokens + limit} "
        f"tokens ({prompt_tokens} in the messages, {limit} in the completion).")


def test_unknown_model_is_404(http):
    err = _error(http.post("/v1/chat/completions", json={"model": "gpt-17", "messages": CHAT}), 404)
    assert err["code"] == "model_not_found" and "gpt-17" in err["message"]


def test_unknown_route_and_method_get_the_envelope(http):
    _error(http.get("/v1/nothing-here"), 404)
    _error(http.get("/v1/chat/completions"), 405)


@pytest.mark.parametrize("field", ["top_k", "seed", "min_tokens", "temperature", "presence_penalty", "top_p",
                                   "stop_token_ids", "logprobs", "n", "max_tokens"])
@pytest.mark.parametrize("value", [2**63, 2**64, 10**400])
def test_huge_integers_are_refused_or_served_and_the_engine_lives(http, field, value):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: [value] if field == "stop_token_ids" else value}
    r = http.post("/v1/completions", json=body)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["param"] in (field, "prompt"), r.text
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_non_standard_json_constants_are_400(http):
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"model": "%s", "prompt": "Hi", "temperature": %s}' % (MODEL.encode(), constant)
        _error(http.post("/v1/completions", content=body, headers={"content-type": "application/json"}), 400)


def test_null_means_the_default(http):
    nulls = {k: None for k in ("n", "stream", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
                               "ignore_eos", "min_tokens", "skip_special_tokens", "temperature", "top_p", "seed",
                               "stop", "stream_options", "add_generation_prompt")}
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, **nulls, "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", **nulls, "max_tokens": 3, "echo": None})
    assert r.status_code == 200, r.text


def test_n_is_capped(http):
    err = _error(http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "n": 100000, "max_tokens": 1}),
                 400)
    assert err["param"] == "n"


def test_tool_and_function_messages_reach_the_template(http):
    messages = [{"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4"},
                {"role": "function", "name": "add", "content": "4"}]
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_a_client_cannot_swap_the_chat_template(http):
    body = {"messages": CHAT, "add_generation_prompt": False,
            "chat_template_kwargs": {"chat_template": "INJECTED {{ messages[0]['content'] }}"}}
    without = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, **body})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == without["count"]


def test_detokenize_out_of_range_is_400(http):
    _error(http.post("/detokenize", json={"tokens": [-1]}), 400)
    _error(http.post("/tokenize", json={}), 400)


_BIG = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400])
_SCALARS = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | _BIG
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
_FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
           "min_p", "n", "stop", "stop_token_ids", "seed", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "logprobs", "top_logprobs", "stream", "stream_options", "ignore_eos", "min_tokens",
           "skip_special_tokens", "echo", "user", "tokens", "response_format", "guided_regex", "guided_choice",
           "tools", "tool_choice", "logit_bias", "best_of", "prompt_logprobs", "priority", "suffix"]
_SMALL = {"max_tokens": st.integers(-3, 3), "max_completion_tokens": st.integers(-3, 3), "n": st.integers(-1, 3),
          "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]),
                                                      "content": st.text(max_size=12) | _JSON}), max_size=2),
          "prompt": st.text(max_size=12) | st.lists(st.integers(-5, 60000), max_size=4) | _JSON,
          "model": st.sampled_from([MODEL, "other"]) | _JSON}
_BODY = st.fixed_dictionaries({}, optional={f: _SMALL.get(f, _JSON) for f in _FIELDS})


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_BODY, path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]))
def test_fuzzed_bodies_never_get_a_5xx(server, body, path):
    if isinstance(body.get("max_tokens"), int) or "max_tokens" not in body:
        body.setdefault("max_tokens", 2)  # keep generations short: the point is the validation
    body["max_tokens"] = body["max_tokens"] if not isinstance(body["max_tokens"], int) else min(body["max_tokens"], 3)
    response = httpx.post(f"{server.base_url}{path}", json=body, timeout=60)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
