"""Start, protect, refuse, drain: /health while loading, --api-key, 413, queue 503, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

from infer_core.testing import make_tiny_checkpoint
from infer_core.testing_server import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
KEY = "s3cret-key"
SOCKET_BUFFER_BYTES = 212_992  # Linux's default (net.core.wmem_default, rmem_default)


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory):
    """The default model with an API key, a small body limit, and room for one waiting request."""
    proc = ServerProcess(tmp_path_factory.mktemp("strict") / "serve.log", "--api-key", KEY, "--max-request-bytes",
                         "4096", "--max-num-seqs", "1", "--max-queued-requests", "1")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def test_health_is_503_while_loading_then_200(strict_server):
    codes = strict_server.health_codes
    assert codes[0] == 503 and codes[-1] == 200, codes


def test_api_key_guards_the_api_but_not_health_or_metrics(strict_server):
    base = strict_server.base_url
    for method, path, body in [("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": "x"}),
                               ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [1]}),
                               ("GET", "/v1/plugins", None)]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
    ok = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(base + "/v1/models", headers=ok).status_code == 200
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/metrics").status_code == 200


def test_openai_client_with_the_key(strict_server):
    from openai import AuthenticationError, OpenAI

    with OpenAI(base_url=f"{strict_server.base_url}/v1", api_key=KEY, max_retries=0) as client:
        reply = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens <= 3
    with OpenAI(base_url=f"{strict_server.base_url}/v1", api_key="nope", max_retries=0) as client, \
            pytest.raises(AuthenticationError):
        client.models.list()


def test_oversized_body_is_413(strict_server):
    body = {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}
    r = httpx.post(f"{strict_server.base_url}/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 413, r.text
    assert "--max-request-bytes" in r.json()["error"]["message"]


def _gauge(base_url: str, name: str) -> float:
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"infer:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"infer:{name} missing from /metrics")


async def _fill_the_queue_then_ask(base_url: str) -> tuple[httpx.Response, list[str]]:
    """One request running and one waiting (max_num_seqs=1, max_queued_requests=1), then a third."""
    long_body = {"model": MODEL, "prompt": "Count slowly:", "max_tokens": 500, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=300, headers=headers) as client:
        async def hold(ready: asyncio.Event, done: asyncio.Event) -> None:
            async with client.stream("POST", "/v1/completions", json=long_body) as r:
                ready.set()
                async for _ in r.aiter_lines():
                    if done.is_set():
                        return  # disconnect: the server aborts it

        done = asyncio.Event()
        holders = []
        for gauge in ("num_requests_running", "num_requests_waiting"):
            ready = asyncio.Event()
            holders.append(asyncio.ensure_future(hold(ready, done)))
            await ready.wait()
            deadline = time.monotonic() + 60
            while _gauge(base_url, gauge) < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        states = [f"running={_gauge(base_url, 'num_requests_running')}",
                  f"waiting={_gauge(base_url, 'num_requests_waiting')}"]
        refused = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        done.set()
        await asyncio.gather(*holders)
    return refused, states


def test_a_full_queue_answers_503_with_retry_after(strict_server):
    refused, states = asyncio.run(_fill_the_queue_then_ask(strict_server.base_url))
    assert states == ["running=1.0", "waiting=1.0"]
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] and "max_queued_requests" in refused.json()["error"]["message"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-serve"))


def test_chat_without_a_template_is_400_naming_chat_template(tiny_model, tmp_path):
    proc = ServerProcess(tmp_path / "serve.log", "--model", str(tiny_model))
    try:
        proc.wait_ready()
        r = httpx.post(f"{proc.base_url}/v1/chat/completions",
                       json={"model": str(tiny_model), "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "--chat-template" in r.json()["error"]["message"]
        r = httpx.post(f"{proc.base_url}/v1/completions", json={"model": str(tiny_model), "prompt": [5, 6, 7],
                                                                 "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        assert proc.stop() == 0


async def _streams_through_sigterm(proc: ServerProcess, count: int, max_tokens: int) -> tuple[list[dict], int]:
    """Start ``count`` streams, SIGTERM the server mid-way; each stream's finish reason and token count."""
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}

    async def one(client: httpx.AsyncClient) -> dict:
        result = {"finish_reason": None, "tokens": 0, "done": False}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    result["done"] = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0]["finish_reason"]:
                        result["finish_reason"] = chunk["choices"][0]["finish_reason"]
                    if chunk.get("usage"):
                        result["tokens"] = chunk["usage"]["completion_tokens"]
        return result

    async with httpx.AsyncClient(base_url=proc.base_url, timeout=120) as client:
        tasks = [asyncio.ensure_future(one(client)) for _ in range(count)]
        deadline = time.monotonic() + 60
        while _running(await client.get("/metrics")) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        proc.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        late = await client.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
        results = await asyncio.gather(*tasks)
    return results, late.status_code


def _running(response: httpx.Response) -> float:
    for line in response.text.splitlines():
        if line.startswith("infer:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigterm_lets_running_streams_finish_then_exits_0(tiny_model, tmp_path):
    proc = ServerProcess(tmp_path / "serve.log", "--model", str(tiny_model), "--served-model-name", "tiny",
                         "--shutdown-timeout", "60")
    proc.wait_ready()
    try:
        results, late_status = asyncio.run(_streams_through_sigterm(proc, 8, 300))
    finally:
        code = proc.stop(timeout=90)
    assert late_status == 503  # draining: no new work
    assert [r["finish_reason"] for r in results] == ["length"] * 8, results
    assert all(r["tokens"] == 300 and r["done"] for r in results), results
    assert code == 0, proc.log()


def test_sigterm_aborts_what_outlives_the_timeout(tiny_model, tmp_path):
    proc = ServerProcess(tmp_path / "serve.log", "--model", str(tiny_model), "--served-model-name", "tiny",
                         "--shutdown-timeout", "0.5", "--max-model-len", "1024")
    proc.wait_ready()
    started = time.monotonic()
    try:
        results, _ = asyncio.run(_streams_through_sigterm(proc, 4, 1000))
    finally:
        code = proc.stop(timeout=90)
    assert [r["finish_reason"] for r in results] == ["abort"] * 4, results
    assert all(r["done"] and r["tokens"] < 1000 for r in results)
    assert code == 0, proc.log()
    assert time.monotonic() - started < 60


def test_plain_uvicorn_serves_the_app_configured_from_the_environment(tmp_path):
    """``uvicorn infer_core.server.app:app`` with INFER_* variables, as a deployment would run it, on uvloop
    (libuv makes a descriptor it watches non-blocking): the core's first message carries a tokenizer that
    pickles to several times a socket's buffer, and the server must read it whole, become ready and answer."""
    import subprocess
    import sys

    from infer_core.testing import write_word_tokenizer
    from infer_core.testing_server import free_port

    model = write_word_tokenizer(make_tiny_checkpoint("llama", tmp_path / "model"), vocab_size=60_000)
    assert (model / "tokenizer.json").stat().st_size > 4 * SOCKET_BUFFER_BYTES  # its pickle holds this file's text
    port = free_port()
    env = {**os.environ, "INFER_MODEL": str(model), "INFER_SERVED_MODEL_NAME": "tiny-env", "HF_HUB_OFFLINE": "1"}
    with open(tmp_path / "uvicorn.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "uvicorn", "infer_core.server.app:app", "--port", str(port),
                                    "--loop", "uvloop"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            health = None
            while time.monotonic() < deadline and health != 200:
                try:
                    health = httpx.get(f"{base}/health", timeout=2).status_code
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            assert health == 200, (tmp_path / "uvicorn.log").read_text()[-3000:]
            r = httpx.post(f"{base}/v1/completions", json={"model": "tiny-env", "prompt": "w3 w4", "max_tokens": 3,
                                                           "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 3,
                                                                  "total_tokens": 5}, r.text
            assert len(r.json()["choices"][0]["text"].split()) == 3
            assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == ["tiny-env"]
            r = httpx.post(f"{base}/v1/completions", json={"model": "tiny-env", "prompt": [3, 4], "max_tokens": 3,
                                                           "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(60)
    # plain uvicorn shuts down gracefully, then re-raises the signal (``infer serve`` exits 0 instead)
    log_text = (tmp_path / "uvicorn.log").read_text()
    assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in log_text, log_text[-3000:]


def test_sampling_defaults_come_from_generation_config(tmp_path):
    model = make_tiny_checkpoint("qwen3", tmp_path / "model")
    (model / "generation_config.json").write_text(json.dumps({"do_sample": False, "top_k": 20}))
    proc = ServerProcess(tmp_path / "serve.log", "--model", str(model), "--served-model-name", "tiny")
    try:
        proc.wait_ready()

        def complete(**extra) -> list[int]:
            body = {"model": "tiny", "prompt": [9, 8, 7], "max_tokens": 12, "ignore_eos": True, "logprobs": 0, **extra}
            r = httpx.post(f"{proc.base_url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["logprobs"]["token_logprobs"]

        greedy = complete(temperature=0)
        assert complete() == greedy == complete()  # no temperature sent: the config's greedy applies
        sampled = [complete(temperature=1.5, seed=s) for s in range(4)]
        assert any(s != greedy for s in sampled)  # an explicit temperature overrides the default
    finally:
        assert proc.stop() == 0
