"""Continuous batching under load, client disconnects, and /metrics, against a real server."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from infer_core import SamplingParams

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
USAGE = 'infer:kv_cache_usage_perc{model_name="SmolLM2-135M-Instruct"}'


async def _stream_completion(base_url: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600) as client:
        stream = await client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=max_tokens,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        text, tokens = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return text, tokens


async def _timed(base_url: str, prompts: list[str], max_tokens: int) -> tuple[list[str], float, int]:
    started = time.perf_counter()
    results = await asyncio.gather(*(_stream_completion(base_url, p, max_tokens) for p in prompts))
    elapsed = time.perf_counter() - started
    return [text for text, _ in results], elapsed, sum(tokens for _, tokens in results)


def test_32_concurrent_streams_match_offline_and_batch(server, offline_llm, record_property):
    prompts = [f"Here is fact number {i} about the ocean:" for i in range(32)]
    max_tokens = 48
    expected = offline_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                                    use_tqdm=False)
    texts, t32, tokens32 = asyncio.run(_timed(server.base_url, prompts, max_tokens))
    assert texts == [o.outputs[0].text for o in expected]
    assert tokens32 == 32 * max_tokens
    _, t1, tokens1 = asyncio.run(_timed(server.base_url, prompts[:1], max_tokens))
    assert tokens1 == max_tokens
    speedup = (tokens32 / t32) / (tokens1 / t1)
    record_property("output_tok_s_c1", tokens1 / t1)
    record_property("output_tok_s_c32", tokens32 / t32)
    print(f"output tok/s: concurrency 1 {tokens1 / t1:.1f}, concurrency 32 {tokens32 / t32:.1f} ({speedup:.1f}x)")
    assert speedup >= 4, f"concurrency 32 gives only {speedup:.1f}x the output tok/s of concurrency 1"


def _wait_for_usage(server, value: float, within: float) -> float:
    deadline = time.monotonic() + within
    while True:
        usage = server.metrics()[USAGE]
        if usage <= value or time.monotonic() > deadline:
            return usage
        time.sleep(0.05)


def _long_body(prompt: str, stream: bool) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def test_streaming_disconnect_frees_blocks_within_a_second(server):
    idle = server.metrics()[USAGE]
    body = _long_body("Count to a thousand:", True)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(6):  # a few chunks arrived: the request holds KV blocks
                next(line for line in lines if line.startswith("data:"))
            assert server.metrics()[USAGE] > idle
        left = time.monotonic()  # the connection is closed here
    usage = _wait_for_usage(server, idle, within=1.0)
    assert usage <= idle, f"KV usage {usage} still above idle {idle} {time.monotonic() - left:.2f}s after disconnect"


def test_non_streaming_disconnect_frees_blocks(server):
    idle = server.metrics()[USAGE]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=_long_body("Count to a thousand:", False), timeout=1.5)
    usage = _wait_for_usage(server, idle, within=1.0)
    assert usage <= idle


async def _disconnect_one_of_three(base_url: str) -> list[str]:
    async def quitter():
        async with httpx.AsyncClient(timeout=60) as http:
            async with http.stream("POST", f"{base_url}/v1/completions", json=_long_body("Spell the alphabet:", True)) \
                    as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data:")
                    if seen == 3:
                        return  # leaves mid-stream

    results = await asyncio.gather(quitter(), _stream_completion(base_url, "The moon is", 40),
                                   _stream_completion(base_url, "The sun is", 40))
    return [text for text, _ in results[1:]]


def test_other_streams_are_unaffected_by_a_disconnect(server, offline_llm):
    before = server.metrics()
    texts = asyncio.run(_disconnect_one_of_three(server.base_url))
    expected = offline_llm.generate(["The moon is", "The sun is"],
                                    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    assert texts == [o.outputs[0].text for o in expected]
    key = 'infer:request_success_total{finished_reason="abort",model_name="SmolLM2-135M-Instruct"}'
    deadline = time.monotonic() + 5
    while server.metrics().get(key, 0) <= before.get(key, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metrics()[key] >= before.get(key, 0) + 1


METRICS = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
           "prefix_cache_hits_total", "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
           "request_success_total", "time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
           "e2e_request_latency_seconds_count", "request_queue_time_seconds_count"]


def test_metrics_after_a_few_requests(server):
    body = {"model": MODEL, "prompt": "A shared prefix for the cache test, repeated. " * 4, "max_tokens": 8,
            "temperature": 0}
    for _ in range(3):
        assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).status_code == 200
    values = server.metrics()
    label = f'model_name="{MODEL}"'

    def value(name: str, extra: str = "") -> float:
        matches = [v for k, v in values.items() if k.startswith(f"infer:{name}{{") and label in k and extra in k]
        assert matches, f"infer:{name} is missing from /metrics"
        return sum(matches)

    for name in METRICS:
        value(name)
    assert value("num_requests_running") == 0 and value("num_requests_waiting") == 0
    assert 0 <= value("kv_cache_usage_perc") <= 1
    assert value("prompt_tokens_total") >= 3 * 20 and value("generation_tokens_total") >= 3 * 8
    assert value("request_success_total", 'finished_reason="length"') >= 3
    assert value("prefix_cache_hits_total") > 0  # the 2nd and 3rd share the 1st's prompt
    assert value("prefix_cache_queries_total") >= value("prefix_cache_hits_total")
    assert value("time_to_first_token_seconds_count") >= 3 and value("e2e_request_latency_seconds_count") >= 3
    assert value("inter_token_latency_seconds_count") >= 3 * 7
    assert value("time_to_first_token_seconds_sum") > 0
    # the core loop's step timeline (engine/step_tally.py): a prompt's step (the 2nd and 3rd may find all but their
    # last token cached: a step of one token, counted as decode), then 7 decode steps each
    assert value("engine_core_steps_total", 'kind="prefill"') >= 1 and value("engine_core_steps_total") >= 3 * 8
    assert value("engine_core_step_tokens_total", 'kind="decode"') >= 3 * 7
    assert value("engine_core_busy_seconds_total") >= value("engine_core_step_seconds_total") > 0
    assert value("engine_core_output_send_seconds_total") > 0


def test_tokenize_detokenize_round_trip(server, offline_llm):
    text = "Hello, world! Ünïcödé too."
    reply = httpx.post(f"{server.base_url}/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert reply["tokens"] == offline_llm.get_tokenizer().encode(text, add_special_tokens=False)
    assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] > 0
    back = httpx.post(f"{server.base_url}/detokenize", json={"tokens": reply["tokens"]}).json()
    assert back["prompt"] == text
    chat = httpx.post(f"{server.base_url}/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["count"] > 2


def test_plugins_endpoint_shows_the_resolved_engine(server):
    reply = httpx.get(f"{server.base_url}/v1/plugins").json()
    assert reply["chosen"]["attention"]["name"] == "torch"
    assert reply["chosen"]["scheduler"]["distribution"] == "infer-core"
    assert set(reply["chosen"]) == {"attention", "kv_allocator", "scheduler", "quantization", "parallel", "decoding",
                                     "grammar"}
    names = {(row["kind"], row["name"]) for row in reply["implementations"]}
    assert ("attention", "torch") in names and ("kv_allocator", "paged") in names
    json.dumps(reply)  # plain JSON all the way down
