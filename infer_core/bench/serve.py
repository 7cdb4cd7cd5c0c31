"""``infer bench serve``: a load generator for any OpenAI-compatible endpoint.

Streams ``--num-prompts`` requests to ``<base>/v1/completions`` (or chat) at each offered load
(``--concurrency`` values, or Poisson ``--request-rate`` values) and reports request throughput,
output tok/s and mean/p50/p90/p99 of TTFT, TPOT, ITL and E2E, as a table and as JSON. Because it
only speaks the OpenAI API, infer and its peers (vLLM, SGLang) are measured by the same client.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass
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
from infer_core.bench.load import arrival_rng, run_load
from infer_core.bench.prompts import read_prompts_file
from infer_core.bench.ready import NotReadyError, wait_until_ready
from infer_core.bench.report import check_appendable, format_table, write_record
from infer_core.bench.results import LoadPointResult, summarize_run
from infer_core.bench.stream import auth_headers, list_models, send_streaming_request
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


async def benchmark(config: ServeBenchConfig) -> ServeBenchResult:
    """Warm up, then run ``num_prompts`` requests at each load point; the library entry point."""
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
                await wait_until_ready(client, base, headers, config.wait_ready_s)
            except NotReadyError as e:
                raise BenchmarkError(f"{e}; check --base-url or wait longer") from e
        model = config.model or await _first_model(client, base, headers)
        url = base + ENDPOINT_PATHS[config.endpoint]

        async def send(payload: dict[str, Any]):
            return await send_streaming_request(client, url, payload, headers)

        if config.warmup:
            await _warm_up(config, send, model, url, pool)
        runs = []
        for index, load in enumerate(config.load_points()):
            prompts = make_prompts(config, config.num_prompts, str(index), pool)
            payloads = [build_payload(config, model, p) for p in prompts]
            arrivals = arrival_rng(config.seed, index)
            with tqdm(
                total=len(prompts),
                desc=load.name,
                unit="req",
                disable=not config.show_progress,
            ) as bar:
                run = await run_load(
                    send, payloads, load, arrivals, on_done=lambda _: bar.update()
                )
            runs.append(summarize_run(load, run, prompts))
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``infer bench serve``."""
    parser.add_argument(
        "--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--endpoint",
        choices=sorted(ENDPOINT_PATHS),
        default="completions",
        help="/v1/completions (default) or /v1/chat/completions",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model to ask for (default: the first of GET /v1/models)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="bearer token (default: $OPENAI_API_KEY, else none)",
    )
    parser.add_argument(
        "--num-prompts", type=int, default=100, help="requests per load point"
    )
    parser.add_argument(
        "--input-len",
        type=int,
        default=512,
        help="tokens per random prompt (completions: ids drawn from [1000, 10000); chat: words)",
    )
    parser.add_argument(
        "--output-len", type=int, default=128, help="max_tokens of every request"
    )
    parser.add_argument(
        "--prompts-file",
        default=None,
        help='given prompts instead of random ones: one per line, text or {"prompt": ...}',
    )
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[],
        help="max requests in flight; several values run a sweep, e.g. 1 8 32",
    )
    load.add_argument(
        "--request-rate",
        type=float,
        nargs="+",
        default=[],
        help="Poisson arrivals per second; inf = all at once (the default); several values sweep",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random prompts and arrival times",
    )
    parser.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send ignore_eos so every request makes exactly --output-len tokens (default on)",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="warm-up requests before the clock (default 1)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one request may take"
    )
    parser.add_argument(
        "--wait-ready",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for a starting server (/health, /v1/models); default 0",
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="write the results record here"
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add this run's rows to the --json file's results instead of replacing it",
    )
    parser.add_argument(
        "--label",
        default=None,
        help="names the system of the result rows (and the record)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> ServeBenchConfig:
    return ServeBenchConfig(
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None,
        endpoint=args.endpoint,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_file=args.prompts_file,
        concurrency=list(args.concurrency or []),
        request_rate=list(args.request_rate or []),
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        warmup=args.warmup,
        timeout_s=args.timeout,
        wait_ready_s=args.wait_ready,
        label=args.label,
        show_progress=not args.no_progress,
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write the JSON; 1 if a load point completed nothing."""
    config = config_from_args(args)
    config.check()
    if args.json and args.append:  # before the run, so a mismatch costs no measurement
        check_appendable(Path(args.json), workload_settings(config))
    result = asyncio.run(benchmark(config))
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
