"""What agents send, against ``infer serve`` on the default model: structured outputs through openai-python's
``parse``, vLLM's guided fields, tool calls (required, named; streamed and whole), and the fields the server
refuses by name rather than ignoring."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema_rs
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOPICS = ["France", "Japan", "Brazil", "Canada", "Egypt", "India", "Italy", "Kenya", "Mexico", "Norway",
          "Peru", "Spain", "Chile", "Ghana", "Greece", "Iceland", "Ireland", "Nepal", "Poland", "Vietnam"]


class Country(BaseModel):
    name: str = Field(max_length=24)
    capital: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=2000)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}


def test_parse_returns_a_valid_object_for_twenty_prompts(server):
    from openai import OpenAI

    validator = jsonschema_rs.validator_for(Country.model_json_schema())
    # 20 requests in one batch of a loaded 2-core CPU take minutes: a longer timeout than the shared client's
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=900)

    def ask(topic: str):
        return client.chat.completions.parse(
            model=MODEL, response_format=Country, temperature=0, max_tokens=60,
            messages=[{"role": "user", "content": f"Describe {topic} as JSON."}])

    with client, ThreadPoolExecutor(len(TOPICS)) as pool:  # one batch: constrained rows side by side
        replies = list(pool.map(ask, TOPICS))
    for reply in replies:
        message = reply.choices[0].message
        assert isinstance(message.parsed, Country), message.content
        validator.validate(json.loads(message.content))


def test_guided_fields_on_completions_and_chat(server):
    url = server.base_url
    choice = httpx.post(f"{url}/v1/completions", json={
        "prompt": "Is the sky blue? Answer:", "max_tokens": 8, "temperature": 0,
        "guided_choice": ["yes", "no"]}, timeout=120).json()
    assert choice["choices"][0]["text"] in ("yes", "no")
    regex = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "A phone number?"}], "max_tokens": 16, "temperature": 0,
        "structured_outputs": {"regex": r"\d{3}-\d{4}"}}, timeout=120).json()
    assert re.fullmatch(r"\d{3}-\d{4}", regex["choices"][0]["message"]["content"])
    body = {"messages": [{"role": "user", "content": "Any JSON object."}], "max_tokens": 24, "temperature": 0,
            "response_format": {"type": "json_object"}}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    stream = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=300)
    chunks = [json.loads(line[6:])["choices"][0] for line in stream.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["delta"].get("content") or "" for c in chunks)
    assert text == whole["message"]["content"] and text.startswith("{")
    if whole["finish_reason"] == "stop":  # else max_tokens cut the object short
        assert isinstance(json.loads(text), dict)


def _tool_args(**extra):  # one call at most: the output ends when the grammar does
    return dict(model=MODEL, temperature=0, max_tokens=64, tools=[WEATHER, TIME], parallel_tool_calls=False,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}], **extra)


def _reassembled(chunks) -> tuple[list[tuple[str, str]], str | None]:
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    return [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_tool_calls_validate_and_stream_alike(client, tool_choice):
    reply = client.chat.completions.create(**_tool_args(tool_choice=tool_choice))
    choice = reply.choices[0]
    calls = choice.message.tool_calls
    assert calls and choice.finish_reason == "tool_calls" and choice.message.content is None
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema_rs.validator_for(schemas[call.function.name]).validate(json.loads(call.function.arguments))
    if isinstance(tool_choice, dict):
        assert [c.function.name for c in calls] == ["get_time"]
    streamed, finish = _reassembled(client.chat.completions.create(**_tool_args(tool_choice=tool_choice), stream=True))
    assert streamed == [(c.function.name, c.function.arguments) for c in calls]
    assert finish == "tool_calls"


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"logit_bias": {"hello": 5}}, "logit_bias.hello"),
    ("/v1/completions", {"logit_bias": {"99999999": 5}}, "logit_bias"),
    ("/v1/completions", {"stop_token_ids": [49152]}, "stop_token_ids"),
    ("/v1/completions", {"best_of": 3, "stream": True}, "best_of"),
    ("/v1/completions", {"priority": 1}, "priority"),
    ("/v1/chat/completions", {"use_beam_search": True}, "use_beam_search"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/chat/completions", {"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}},
     "guided_json"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}},
     "structured_outputs"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_wether"}}},
     "tool_choice"),
])
def test_fields_the_server_does_not_implement_are_refused_by_name(server, path, body, param):
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    reply = httpx.post(f"{server.base_url}{path}", json={**base, "max_tokens": 4, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.text


def test_logit_bias_and_best_of(server):
    url = server.base_url
    biased = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 5, "temperature": 1,
                                                       "seed": 3, "logit_bias": {"330": 100}}, timeout=60).json()
    assert biased["choices"][0]["text"] == httpx.post(f"{url}/detokenize", json={"tokens": [330] * 5}).json()["prompt"]
    best = httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1,
                                                     "seed": 5, "n": 2, "best_of": 4, "logprobs": 0}, timeout=60).json()
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in best["choices"]]
    assert [c["index"] for c in best["choices"]] == [0, 1] and sums[0] >= sums[1]
    every = httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1,
                                                      "seed": 5, "n": 4, "logprobs": 0}, timeout=60).json()
    all_sums = sorted((sum(c["logprobs"]["token_logprobs"]) for c in every["choices"]), reverse=True)
    assert sums == pytest.approx(all_sums[:2], abs=1e-4)  # the same 4 seeded candidates, the best 2 of them


def test_ignored_fields_stay_ignored_and_models_lists_the_refused_ones(server):
    reply = httpx.post(f"{server.base_url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "user": "u", "store": False,
        "metadata": {"k": "v"}, "logit_bias": {}, "some_vendor_extra": 1}, timeout=60)
    assert reply.status_code == 200, reply.text
    card = httpx.get(f"{server.base_url}/v1/models").json()["data"][0]
    assert "use_beam_search" in card["features"]["unsupported_fields"]["chat.completions"]
    assert "json_schema" in card["features"]["response_format"]


def test_echo_with_logprobs_scores_every_prompt_token(server):
    """lm-eval-harness's loglikelihood request (token ids, echo, logprobs=1, max_tokens=1): a prompt token's
    score is the logprob the sampler gave that token when the model generated it after the same context
    (tests/test_prompt_logprobs.py holds the scores to HF transformers')."""
    url = server.base_url
    context = httpx.post(f"{url}/tokenize", json={"prompt": "The capital of France is",
                                                  "add_special_tokens": False}).json()["tokens"]
    first = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": [context], "temperature": 0,
                                                      "max_tokens": 1, "logprobs": 1}, timeout=120).json()
    generated = first["choices"][0]["logprobs"]
    token = httpx.post(f"{url}/tokenize", json={"prompt": generated["tokens"][0],
                                                "add_special_tokens": False}).json()["tokens"]
    assert len(token) == 1, generated
    prompt = context + token
    reply = httpx.post(f"{url}/v1/completions", json={
        "model": MODEL, "prompt": [prompt], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
        "echo": True}, timeout=120).json()
    logprobs = reply["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(prompt) + 1 and logprobs["token_logprobs"][0] is None
    assert logprobs["tokens"][len(context)] == generated["tokens"][0]
    assert logprobs["token_logprobs"][len(context)] == pytest.approx(generated["token_logprobs"][0], abs=1e-4)
    assert logprobs["top_logprobs"][len(context)] == pytest.approx(generated["top_logprobs"][0], abs=1e-4)
    for i in range(1, len(prompt)):  # the best alternative is at least as likely as the prompt's token
        assert max(logprobs["top_logprobs"][i].values()) >= logprobs["token_logprobs"][i] - 1e-6
    assert sum(logprobs["token_logprobs"][1:len(prompt)]) < 0
