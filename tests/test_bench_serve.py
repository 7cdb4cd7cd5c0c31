"""``infer bench serve`` against a small real HTTP server whose timing is known.

The fixture server speaks the OpenAI streaming protocol (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``) and sleeps fixed times before its first chunk and between chunks, so
the client's measurements can be checked against what the server did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from infer_core.bench.load import arrival_offsets, arrival_rng
from infer_core.bench.prompts import PromptsFileError, read_prompts_file
from infer_core.bench.report import RecordFileError
from infer_core.bench.serve import (
    BenchmarkError,
    ServeBenchConfig,
    add_arguments,
    benchmark,
    run,
)
from infer_core.bench.serve import main as serve_main
from infer_core.bench.stats import percentile, summarize

MODEL = "fake-model"


@dataclass
class FakeServerState:
    """How the fixture server behaves, and what it saw."""

    first_sleep: float = 0.05
    chunk_sleep: float = 0.02
    send_usage: bool = True
    fail_every: int | None = (
        None  # every n-th request (1-based, warm-up included) gets a 500
    )
    error_in_stream_every: int | None = (
        None  # every n-th request breaks off with an error event
    )
    ready_at: float = (
        0.0  # time.perf_counter() before which the model is "loading" (503)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    bodies: list[dict] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


class _Handler(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True  # each SSE line leaves at once

    def log_message(self, *args):
        pass

    @property
    def state(self) -> FakeServerState:
        return self.server.state

    def _send_json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _is_loading(self) -> bool:
        return time.perf_counter() < self.state.ready_at

    def do_GET(self):
        if self.path == "/health":
            if self._is_loading():
                self._send_json(
                    503, {"status": "loading", "detail": "the model is still loading"}
                )
            else:
                self._send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send_json(
                200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            )
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        state = self.state
        with state.lock:
            state.arrivals.append(time.perf_counter())
            state.bodies.append(body)
            number = len(state.bodies)
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            self._answer(body, number)
        finally:
            self._leave()

    def _leave(self) -> None:
        with self.state.lock:
            if getattr(self, "_counted_out", False):
                return
            self._counted_out = True
            self.state.in_flight -= 1

    def _answer(self, body: dict, number: int) -> None:
        state = self.state
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._leave()
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if self._is_loading():
            self._leave()
            self._send_json(503, {"error": {"message": "the model is still loading"}})
            return
        if state.fail_every and number % state.fail_every == 0:
            self._leave()
            message = f"boom: request {number} refused"
            self._send_json(
                500, {"error": {"message": message, "type": "server_error"}}
            )
            return
        is_chat = self.path.endswith("chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(state.first_sleep)
        num_tokens = body["max_tokens"]
        for i in range(num_tokens):
            if i:
                time.sleep(state.chunk_sleep)
            if (
                state.error_in_stream_every
                and number % state.error_in_stream_every == 0
                and i == 1
            ):
                self._leave()
                self._event(
                    {"error": {"message": "engine died mid-stream", "code": 500}}
                )
                return
            choice = (
                {"index": 0, "delta": {"content": f"w{i} "}}
                if is_chat
                else {"index": 0, "text": f"t{i} "}
            )
            self._event({"id": f"req-{number}", "choices": [choice]})
        if state.send_usage:
            prompt = body.get("prompt")
            prompt_tokens = len(prompt) if isinstance(prompt, list) else 7
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": num_tokens}
            self._event({"id": f"req-{number}", "choices": [], "usage": usage})
        self._leave()  # before [DONE]: the client may start its next request as soon as it reads it
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = (
        128  # the default 5 makes the kernel drop bursts of connections for 1 s
    )


@pytest.fixture
def fake_server():
    """``fake_server(**behaviour)`` -> (base_url, state) of a server running in a thread."""
    servers = []

    def start(**behaviour) -> tuple[str, FakeServerState]:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.state = FakeServerState(**behaviour)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", server.state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _config(base_url: str, **overrides) -> ServeBenchConfig:
    values = {"num_prompts": 8, "input_len": 16, "output_len": 5, "warmup": 1}
    values.update(overrides)
    return ServeBenchConfig(base_url=base_url, show_progress=False, **values)


# --- statistics ---


@pytest.mark.parametrize("size", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy(size):
    values = np.random.default_rng(size).exponential(10.0, size).tolist()
    for q in (0, 1, 33.3, 50, 90, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(
            np.percentile(values, q), rel=1e-12, abs=1e-12
        )
    summary = summarize(values)
    assert summary.mean == pytest.approx(np.mean(values), rel=1e-12)
    assert (summary.p50, summary.p90, summary.p99) == pytest.approx(
        np.percentile(values, [50, 90, 99]).tolist()
    )
    assert summary.count == size


def test_summary_of_nothing_is_none_and_bad_percentiles_are_refused():
    summary = summarize([])
    assert (summary.mean, summary.p50, summary.p90, summary.p99, summary.count) == (
        None,
        None,
        None,
        None,
        0,
    )
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_poisson_arrivals_have_exponential_gaps():
    offsets = arrival_offsets(20001, 50.0, random.Random(0))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps > 0).all()
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.03)
    assert gaps.std() == pytest.approx(1 / 50.0, rel=0.05)  # exponential: std == mean
    assert arrival_offsets(5, math.inf, random.Random(0)) == [0.0] * 5


# --- against the fixture server ---


def test_counts_tokens_and_times_every_request(fake_server):
    base_url, state = fake_server(first_sleep=0.05, chunk_sleep=0.02)
    result = asyncio.run(benchmark(_config(base_url, concurrency=[4])))

    assert result.model == MODEL  # the first id of /v1/models
    (run,) = result.runs
    assert (run.num_requests, run.num_completed, run.num_failed, run.first_error) == (
        8,
        8,
        0,
        None,
    )
    assert run.total_output_tokens == 8 * 5
    assert run.total_input_tokens == 8 * 16
    assert len(state.bodies) == 1 + 8  # the warm-up, then the measured requests
    for body in state.bodies:
        assert (
            body["model"] == MODEL
            and body["max_tokens"] == 5
            and body["ignore_eos"] is True
        )
        assert body["stream"] is True and body["stream_options"] == {
            "include_usage": True
        }
        assert len(body["prompt"]) == 16 and all(
            1000 <= t < 10000 for t in body["prompt"]
        )
    assert (
        len({tuple(b["prompt"]) for b in state.bodies}) == 9
    )  # no prompt repeats, warm-up included

    ttfts = [r.ttft for r in run.records]
    assert min(ttfts) >= 0.05
    gaps = [gap for r in run.records for gap in r.itl]
    assert len(gaps) == 8 * (5 - 1)
    assert 0.015 <= statistics.median(gaps) <= 0.045
    assert 15 <= run.itl_ms.p50 <= 45
    assert 18 <= run.tpot_ms.mean <= 45  # (e2e - ttft) / 4 gaps of 20 ms
    assert run.e2e_ms.p50 >= 50 + 4 * 20
    assert run.ttft_ms.p50 >= 50 and run.ttft_ms.p99 >= run.ttft_ms.p50
    assert run.output_tok_s == pytest.approx(40 / run.duration_s)
    assert run.request_throughput == pytest.approx(8 / run.duration_s)


def test_concurrency_caps_requests_in_flight(fake_server):
    base_url, state = fake_server(first_sleep=0.03, chunk_sleep=0.005)
    result = asyncio.run(
        benchmark(
            _config(
                base_url, num_prompts=12, output_len=3, concurrency=[3, 1], warmup=0
            )
        )
    )
    assert [r.num_completed for r in result.runs] == [12, 12]
    assert [r.max_in_flight for r in result.runs] == [3, 1]
    assert state.max_in_flight == 3  # what the server saw over both load points
    # a sweep draws fresh prompts per load point, so the second cannot hit the first's prefix cache
    first, second = state.bodies[:12], state.bodies[12:]
    assert not {tuple(b["prompt"]) for b in first} & {
        tuple(b["prompt"]) for b in second
    }


def test_request_rate_sends_on_a_poisson_schedule(fake_server):
    base_url, state = fake_server(first_sleep=0.0, chunk_sleep=0.0)
    config = _config(
        base_url, num_prompts=12, output_len=2, request_rate=[20.0], warmup=0, seed=3
    )
    result = asyncio.run(benchmark(config))
    assert result.runs[0].num_completed == 12
    expected = arrival_offsets(12, 20.0, arrival_rng(3, 0))
    seen = [t - state.arrivals[0] for t in state.arrivals]
    assert expected[-1] > 0.2  # the schedule spreads requests over time
    for want, got in zip(expected, seen, strict=True):
        assert got == pytest.approx(want, abs=0.05)


def test_infinite_rate_sends_everything_at_once(fake_server):
    base_url, state = fake_server(first_sleep=0.2, chunk_sleep=0.0)
    result = asyncio.run(
        benchmark(_config(base_url, num_prompts=10, output_len=2, warmup=0))
    )
    assert result.runs[0].num_completed == 10
    assert state.max_in_flight == 10  # nobody waited for anybody
    assert max(state.arrivals) - min(state.arrivals) < 0.15


def test_server_errors_are_failures_with_their_message(fake_server):
    base_url, _ = fake_server(first_sleep=0.0, chunk_sleep=0.0, fail_every=3)
    result = asyncio.run(
        benchmark(
            _config(base_url, num_prompts=9, output_len=4, concurrency=[1], warmup=0)
        )
    )
    (run,) = result.runs
    assert (run.num_completed, run.num_failed) == (6, 3)
    assert run.first_error == "HTTP 500: boom: request 3 refused"
    assert run.total_output_tokens == 6 * 4
    assert run.e2e_ms.count == 6  # latencies only of completed requests


def test_an_error_event_inside_the_stream_is_a_failure(fake_server):
    base_url, _ = fake_server(first_sleep=0.0, chunk_sleep=0.0, error_in_stream_every=2)
    result = asyncio.run(
        benchmark(
            _config(base_url, num_prompts=4, output_len=4, concurrency=[1], warmup=0)
        )
    )
    (run,) = result.runs
    assert (run.num_completed, run.num_failed) == (2, 2)
    assert run.first_error == "error in stream: engine died mid-stream"


def test_without_a_usage_chunk_tokens_are_counted_by_chunk(fake_server):
    base_url, _ = fake_server(first_sleep=0.0, chunk_sleep=0.0, send_usage=False)
    result = asyncio.run(
        benchmark(_config(base_url, num_prompts=3, output_len=6, concurrency=[2]))
    )
    assert result.runs[0].total_output_tokens == 3 * 6


def test_chat_endpoint_sends_messages_of_random_words(fake_server):
    base_url, state = fake_server(first_sleep=0.0, chunk_sleep=0.0)
    config = _config(
        base_url,
        endpoint="chat",
        num_prompts=3,
        input_len=10,
        output_len=4,
        concurrency=[1],
    )
    result = asyncio.run(benchmark(config))
    assert (
        result.runs[0].num_completed == 3 and result.runs[0].total_output_tokens == 12
    )
    for body in state.bodies:
        (message,) = body["messages"]
        assert message["role"] == "user" and len(message["content"].split()) == 10


def test_given_prompts_file(fake_server, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        'plain text prompt\n\n{"prompt": "json prompt"}\n{"prompt": [5, 6, 7]}\n'
    )
    assert read_prompts_file(path) == ["plain text prompt", "json prompt", [5, 6, 7]]
    base_url, state = fake_server(first_sleep=0.0, chunk_sleep=0.0)
    asyncio.run(
        benchmark(
            _config(
                base_url,
                prompts_file=str(path),
                num_prompts=4,
                concurrency=[1],
                warmup=0,
            )
        )
    )
    assert [b["prompt"] for b in state.bodies] == [
        "plain text prompt",
        "json prompt",
        [5, 6, 7],
        "plain text prompt",
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(PromptsFileError, match="line 1"):
        read_prompts_file(bad)


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(BenchmarkError, match="check --base-url"):
        asyncio.run(benchmark(_config("http://127.0.0.1:9", timeout_s=5)))


def test_a_failing_warm_up_stops_the_benchmark(fake_server):
    base_url, _ = fake_server(fail_every=1)
    with pytest.raises(
        BenchmarkError, match="warm-up request .* failed: HTTP 500: boom"
    ):
        asyncio.run(benchmark(_config(base_url)))


def test_wait_ready_waits_for_a_loading_server(fake_server):
    base_url, state = fake_server(first_sleep=0.0, chunk_sleep=0.0)
    state.ready_at = math.inf
    with pytest.raises(BenchmarkError, match="still loading.*--wait-ready"):
        asyncio.run(benchmark(_config(base_url)))
    with pytest.raises(
        BenchmarkError, match="not ready after 0.2 s.*/health: HTTP 503"
    ):
        asyncio.run(benchmark(_config(base_url, wait_ready_s=0.2)))
    state.ready_at = time.perf_counter() + 0.5
    result = asyncio.run(benchmark(_config(base_url, num_prompts=2, wait_ready_s=10)))
    assert time.perf_counter() >= state.ready_at
    assert result.runs[0].num_completed == 2


def test_bad_values_are_refused_before_any_request():
    with pytest.raises(BenchmarkError, match="--concurrency or --request-rate"):
        asyncio.run(
            benchmark(
                _config("http://127.0.0.1:9", concurrency=[1], request_rate=[2.0])
            )
        )
    with pytest.raises(BenchmarkError, match="--num-prompts"):
        asyncio.run(benchmark(_config("http://127.0.0.1:9", num_prompts=0)))


# --- the command ---


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_prints_a_table_and_writes_the_record(fake_server, tmp_path, capsys):
    base_url, _ = fake_server(first_sleep=0.0, chunk_sleep=0.0)
    path = tmp_path / "serving.json"
    common = (
        "--base-url",
        base_url + "/v1/",
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--no-progress",
        "--json",
        str(path),
    )
    assert (
        run(
            _parse(
                *common,
                "--output-len",
                "3",
                "--concurrency",
                "1",
                "2",
                "--label",
                "fake",
            )
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "== concurrency 1 ==" in out and "== concurrency 2 ==" in out
    assert "TTFT (ms)" in out and "ITL (ms)" in out and "4 completed, 0 failed" in out

    record = json.loads(path.read_text())
    assert set(record) == {
        "benchmark",
        "device",
        "date",
        "commit",
        "versions",
        "settings",
        "results",
    }
    assert record["benchmark"] == "serving" and record["device"] == "fake"
    assert record["settings"]["input_len"] == 8 and record["settings"][
        "concurrency"
    ] == [1, 2]
    rows = record["results"]
    assert [(r["system"], r["concurrency"], r["completed"]) for r in rows] == [
        ("fake", 1, 4),
        ("fake", 2, 4),
    ]
    for key in (
        "request_throughput",
        "output_tok_s",
        "mean_ttft_ms",
        "p50_tpot_ms",
        "p90_itl_ms",
        "p99_e2e_ms",
    ):
        assert isinstance(rows[0][key], float), key
    assert rows[0]["total_output_tokens"] == 12 and rows[0]["model"] == MODEL

    # a peer measured with the same workload joins the record; another workload is refused
    assert (
        run(
            _parse(
                *common,
                "--output-len",
                "3",
                "--concurrency",
                "1",
                "--label",
                "peer",
                "--append",
            )
        )
        == 0
    )
    assert [r["system"] for r in json.loads(path.read_text())["results"]] == [
        "fake",
        "fake",
        "peer",
    ]
    with pytest.raises(RecordFileError, match="output_len"):
        run(_parse(*common, "--output-len", "5", "--append"))


def test_run_fails_when_nothing_completes(fake_server, capsys):
    base_url, _ = fake_server(fail_every=1)
    args = _parse(
        "--base-url", base_url, "--num-prompts", "2", "--warmup", "0", "--no-progress"
    )
    assert run(args) == 1
    captured = capsys.readouterr()
    assert "0 completed, 2 failed" in captured.out and "boom" in captured.out
    assert "no request completed" in captured.err


def test_request_rate_flag_takes_inf():
    args = _parse("--base-url", "http://x", "--request-rate", "inf", "4")
    assert args.request_rate == [math.inf, 4.0]
    with pytest.raises(SystemExit):  # argparse: the two load modes exclude each other
        _parse("--base-url", "http://x", "--request-rate", "1", "--concurrency", "2")


def test_module_entry_point_reports_user_errors_in_one_line(capsys):
    assert serve_main(["--base-url", "http://127.0.0.1:9", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "error: cannot list models at http://127.0.0.1:9/v1/models"
    )
