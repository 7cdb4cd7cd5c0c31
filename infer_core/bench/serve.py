"""``infer bench serve``: a load generator for any OpenAI-compatible endpoint.

Streams ``--num-prompts`` requests to ``<base>/v1/completions`` (or chat) at each offered load
(``--concurrency`` values, or Poisson ``--request-rate`` values) and reports request throughput,
output tok/s and mean/p50/p90/p99 of TTFT, TPOT, ITL and E2E, as a table and as JSON. Because it
only speaks the OpenAI API, infer and its peers (vLLM, SGLang) are measured by the same client.
Its flags, and the ``ServeBenchConfig`` they make, are in ``serve_flags``. With
``--start-server FLAGS`` it starts ``infer serve FLAGS`` itself (``launch``) and stops it after the
run; ``--offline-row`` then adds the offline engine on the same prompts as a row (``offline_row``). Against
an infer server each load point also gets the engine core's step timeline (``core_timeline``), read from
``/metrics`` before and after it:

    infer bench serve --start-server "--model M --load-format dummy" --concurrency 1 16 64 256 \
        --num-prompts 256 --offline-row --json serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infer_core.bench.config import (
    ENDPOINT_PATHS,
    BenchmarkError,
    Endpoint,
    ServeBenchConfig,
    build_payload,
    make_prompts,
    normalize_base_url,
    workload_settings,
)
from infer_core.bench.core_timeline import core_timeline, read_core_totals
from infer_core.bench.launch import LaunchedServer
from infer_core.bench.lean_stream import send_streaming_request_lean
from infer_core.bench.load import arrival_rng, run_load
from infer_core.bench.offline_row import TIMEOUT_S as OFFLINE_TIMEOUT_S
from infer_core.bench.offline_row import offline_spec
from infer_core.bench.prompts import read_prompts_file
from infer_core.bench.ready import NotReadyError, wait_until_ready
from infer_core.bench.report import check_appendable, format_table, write_record
from infer_core.bench.results import LoadPointResult, summarize_run
from infer_core.bench.serve_flags import add_arguments, config_from_args
from infer_core.bench.stream import auth_headers, list_models, send_streaming_request
from infer_core.bench.systems import run_system
from infer_core.errors import InferError

__all__ = [
    "BenchmarkError",
    "ServeBenchConfig",
    "ServeBenchResult",
    "add_arguments",
    "benchmark",
    "run",
]


@dataclass(slots=True)
class ServeBenchResult:
    """One run per load point, plus what identifies the measurement."""

    model: str
    base_url: str
    endpoint: Endpoint
    label: str | None
    settings: dict[str, Any]
    runs: list[LoadPointResult]
    offline: dict[str, Any] | None = None  # the offline engine's row (--offline-row)


def run_client(coro):
    """Run the load generator's coroutine on uvloop where it is installed: the client reads and parses every
    streamed event, and at tens of thousands of events a second the event loop's own overhead counts."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


START_TIMEOUT_S = 1800.0  # how long a server this command started may take to load its model


def measure(config: ServeBenchConfig) -> ServeBenchResult:
    """The benchmark; with ``server_flags``, around a server started for it, then the offline row if asked."""
    config.check()
    if config.server_flags is None:
        return run_client(benchmark(config))
    server = LaunchedServer(config.server_flags)
    server.start()
    try:
        launched = replace(config, base_url=server.base_url, wait_ready_s=max(config.wait_ready_s, START_TIMEOUT_S))
        result = run_client(benchmark(launched, server.check_running))
    finally:
        code = server.stop()
        server.wait_gone()  # its engine core too: the device is free for the offline engine
    print(f"the server stopped (exit code {code})", flush=True)
    if config.offline_row:
        result.offline = _offline_row(config, len(result.runs) - 1, result.runs[-1].load.name)
    return result


def _offline_row(config: ServeBenchConfig, last: int, load_name: str) -> dict[str, Any]:
    pool = read_prompts_file(config.prompts_file) if config.prompts_file else None
    spec = offline_spec(config, config.server_flags or [], make_prompts(config, config.num_prompts, str(last), pool),
                        make_prompts(config, config.warmup, "warmup", pool), load_name)
    print(f"--- offline engine on the prompts of {load_name} ---", flush=True)
    row, _ = run_system(spec, OFFLINE_TIMEOUT_S)
    return row


async def benchmark(config: ServeBenchConfig, check_alive=None) -> ServeBenchResult:
    """Warm up, then run ``num_prompts`` requests at each load point; the library entry point.

    ``check_alive``: raises when a server this process started has exited (see ``measure``).
    """
    config.check()
    httpx = _import_httpx()
    from tqdm.auto import tqdm

    base = normalize_base_url(config.base_url)
    headers = auth_headers(config.api_key)
    pool = read_prompts_file(config.prompts_file) if config.prompts_file else None
    if pool and config.endpoint == "chat" and not all(isinstance(p, str) for p in pool):
        raise BenchmarkError(
            f"--prompts-file {config.prompts_file} holds token ids, which the chat API"
            " cannot take; use --endpoint completions or text prompts"
        )
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(config.timeout_s), limits=limits
    ) as client:
        if config.wait_ready_s > 0:
            try:
                await wait_until_ready(client, base, headers, config.wait_ready_s, check_alive)
            except NotReadyError as e:
                raise BenchmarkError(f"{e}; check --base-url or wait longer") from e
        model = config.model or await _first_model(client, base, headers)
        url = base + ENDPOINT_PATHS[config.endpoint]

        async def send(payload: dict[str, Any]):
            if url.startswith("http://"):
                return await send_streaming_request_lean(url, payload, headers, config.timeout_s)
            return await send_streaming_request(client, url, payload, headers)

        if config.warmup:
            await _warm_up(config, send, model, url, pool)
        runs = []
        for index, load in enumerate(config.load_points()):
            prompts = make_prompts(config, config.num_prompts, str(index), pool)
            payloads = [build_payload(config, model, p) for p in prompts]
            arrivals = arrival_rng(config.seed, index)
            before = await read_core_totals(client, base, headers)
            started = time.perf_counter()
            with tqdm(
                total=len(prompts),
                desc=load.name,
                unit="req",
                disable=not config.show_progress,
            ) as bar:
                run = await run_load(
                    send, payloads, load, arrivals, on_done=lambda _: bar.update()
                )
            window = time.perf_counter() - started
            result = summarize_run(load, run, prompts)
            if before is not None:
                after = await read_core_totals(client, base, headers)
                result.core_timeline = core_timeline(before, after, window)
            runs.append(result)
    return ServeBenchResult(
        model=model,
        base_url=base,
        endpoint=config.endpoint,
        label=config.label,
        settings=workload_settings(config),
        runs=runs,
    )


async def _warm_up(config: ServeBenchConfig, send, model: str, url: str, pool) -> None:
    """Send the warm-up requests one by one; a failure stops here, before any measurement."""
    from tqdm.auto import tqdm

    prompts = make_prompts(config, config.warmup, "warmup", pool)
    with tqdm(
        total=len(prompts), desc="warm-up", unit="req", disable=not config.show_progress
    ) as bar:
        for prompt in prompts:
            record = await send(build_payload(config, model, prompt))
            bar.update()
            if not record.is_ok:
                raise BenchmarkError(
                    f"the warm-up request to {url} failed: {record.error}; "
                    "check --base-url, --endpoint, --model and --api-key"
                    " (a server still starting: pass --wait-ready SECONDS)"
                )


async def _first_model(client, base: str, headers: dict[str, str]) -> str:
    url = base + "/v1/models"
    try:
        models = await list_models(client, url, headers)
    except Exception as e:  # any failure here means the same thing to the user
        raise BenchmarkError(
            f"cannot list models at {url} ({type(e).__name__}: {e}); check --base-url or pass --model"
        ) from e
    if not models:
        raise BenchmarkError(f"{url} lists no model; pass --model")
    return models[0]


def _import_httpx():
    try:
        import httpx
    except ImportError as e:
        raise BenchmarkError("infer bench serve needs httpx: pip install httpx") from e
    return httpx


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write the JSON; 1 if a load point completed nothing."""
    config = config_from_args(args)
    config.check()
    if args.json and args.append:  # before the run, so a mismatch costs no measurement
        check_appendable(Path(args.json), workload_settings(config))
    result = measure(config)
    print(format_table(result))
    if args.json:
        path = write_record(result, Path(args.json), append=args.append)
        print(f"results written to {path}")
    empty = [r.load.name for r in result.runs if r.num_completed == 0]
    if empty:
        print(f"error: no request completed at {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m infer_core.bench.serve``: the same command without the ``infer`` CLI."""
    parser = argparse.ArgumentParser(
        prog="python -m infer_core.bench.serve", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        return run(args)
    except (InferError, ValueError) as e:  # a user's mistake: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
