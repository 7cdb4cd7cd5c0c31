"""The engine core in its own process, as a user of ``infer serve`` meets it: the start's log, and its death."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import httpx
import pytest

from infer_core.testing_server import ServerProcess

pytestmark = pytest.mark.slow

BODY = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1000, "ignore_eos": True, "stream": True,
        "logprobs": 0}  # a model without a tokenizer streams no text: logprobs make a chunk per token


@pytest.fixture(scope="module")
def tiny_server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("core") / "serve.log", "--model", str(tiny_checkpoint("llama")),
                         "--served-model-name", "tiny")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def test_the_start_logs_each_phase_then_one_ready_line_with_the_url(tiny_server):
    log = tiny_server.log_path.read_text()  # as it was when /health first answered 200
    ready = [line for line in log.splitlines() if "ready: model" in line]
    assert len(ready) == 1, log
    assert f"at {tiny_server.base_url}" in ready[0] and "on cpu" in ready[0], ready[0]
    assert "Uvicorn running" not in log
    # uvicorn's "auto" with the core's dependencies installed: uvloop (not on Windows) and httptools
    assert re.search(r"listening on \S+ \((uvloop|asyncio) event loop, httptools HTTP", log), log
    before_ready = log[:log.index("ready: model")]
    for phase in ("listening on", "engine core process", "tokenizer loaded", "loading the weights", "loaded on cpu",
                  "KV cache"):
        assert phase in before_ready, f"no {phase!r} line before the ready line:\n{log}"
    assert tiny_server.health_codes[0] == 503 and tiny_server.health_codes[-1] == 200


def _core_pid(log: str) -> int:
    return int(re.search(r"engine core process (\d+) started", log).group(1))


def test_a_killed_core_ends_streams_with_an_error_and_requests_get_503(tiny_server):
    base = tiny_server.base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=BODY) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(line for line in lines if line.startswith("data: {"))
            os.kill(_core_pid(tiny_server.log_path.read_text()), signal.SIGKILL)
            killed = time.monotonic()
            rest = [line for line in lines if line.startswith("data: ")]
        ended = time.monotonic() - killed
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][len("data: "):])["error"]
        assert "exited with code -9" in error["message"], error
        assert ended < 10, f"the stream ended {ended:.1f} s after the core was killed"
        started = time.monotonic()
        refused = http.post("/v1/completions", json={**BODY, "stream": False, "max_tokens": 2})
        assert refused.status_code == 503 and time.monotonic() - started < 5, refused.text
        assert "exited with code -9" in refused.json()["error"]["message"]
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "dead", health.text
    assert tiny_server.stop() == 0, tiny_server.log()


def test_a_model_that_cannot_load_is_logged_and_the_server_exits_1(tiny_checkpoint, tmp_path):
    proc = ServerProcess(tmp_path / "serve.log", "--model", str(tiny_checkpoint("llama")), "--max-model-len", "99999")
    try:
        code = proc.process.wait(timeout=240)
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert code == 1, log
    assert "exceeds the model's max_position_embeddings" in log and "could not be loaded" in log, log
    assert "ready: model" not in log
