"""The flags of ``infer bench serve``, and the ``ServeBenchConfig`` they make."""

from __future__ import annotations

import argparse
import os
import shlex

from infer_core.bench.config import ENDPOINT_PATHS, ServeBenchConfig

DESCRIPTION = """\
Load-test an OpenAI-compatible server (infer, vLLM, SGLang): --num-prompts streaming requests at
each --concurrency (or --request-rate) value; reports request and output token throughput, and the
mean, p50, p90 and p99 of TTFT, TPOT, ITL and end-to-end latency, as a table and with --json.

  infer bench serve --base-url http://127.0.0.1:8000 --concurrency 1 8 32
  infer bench serve --start-server "--model M --load-format dummy" --concurrency 1 16 64 256 \\
      --num-prompts 256 --offline-row --json serving.json

--start-server runs `infer serve FLAGS` on a free port for the run and stops it after; --offline-row
then runs the offline engine (LLM) with the same flags, alone on the device, on the last load
point's prompts, and gives every server row its fraction of the offline output tok/s."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``infer bench serve``."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000"
    )
    where.add_argument(
        "--start-server",
        default=None,
        metavar="FLAGS",
        help='start `infer serve FLAGS` for the run and stop it after, e.g. "--model M --load-format dummy"',
    )
    parser.add_argument(
        "--offline-row",
        action="store_true",
        help="then run the offline engine (LLM) with the same flags on the last load point's prompts, "
        "as a row beside the server's (needs --start-server)",
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
        base_url=args.base_url or "",
        server_flags=shlex.split(args.start_server) if args.start_server is not None else None,
        offline_row=args.offline_row,
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
