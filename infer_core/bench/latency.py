"""``infer bench latency``: the decode-latency benchmark (docs/benchmarks.md), infer and its peers.

Batch 1, a ``--prompt-len`` prompt, ``--new-tokens`` greedy tokens (``ignore_eos``), one
warm-up then ``--repeats`` timed runs: end-to-end output tok/s, decode ms per token (mean and
p50) and time to first token. ``--peers hf-generate-static`` is HF ``generate`` with a static
cache and the forward compiled; ``--peers floor`` is the bandwidth floor (all weights and the
context's KV read once per token, over the measured copy bandwidth).

    infer bench latency --attention flash triton torch --peers hf-generate-static floor --out benchmarks/results
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from infer_core.bench.config import BenchmarkError
from infer_core.bench.offline_common import (
    add_common_arguments,
    base_spec,
    check_common,
    common_settings,
    engine_settings,
    finish,
    resolve_model,
    settle_max_model_len,
)
from infer_core.bench.systems import add_floor_fractions, format_rows, run_systems

BENCHMARK = "decode-latency"
PEERS = ("hf-generate-static", "floor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, PEERS)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs after the warm-up")
    parser.add_argument("--profile-skip", type=int, default=8, help="decode steps before the profiled window")


def check(args: argparse.Namespace) -> None:
    check_common(args)
    if args.prompt_len < 1:
        raise BenchmarkError(f"--prompt-len must be at least 1, got {args.prompt_len}")
    if args.new_tokens < 2:
        raise BenchmarkError(f"--new-tokens must be at least 2 (one decode step after the prefill), "
                             f"got {args.new_tokens}")
    if args.repeats < 1:
        raise BenchmarkError(f"--repeats must be at least 1, got {args.repeats}")
    if args.profile_skip < 0:
        raise BenchmarkError(f"--profile-skip must be 0 or more, got {args.profile_skip}")


def check_lengths(args: argparse.Namespace) -> None:
    """Once ``--max-model-len`` is known (its default depends on the model)."""
    profiled = args.profile_skip + args.profile_steps + 2 if args.profile else 0
    if args.prompt_len + max(args.new_tokens, profiled) > args.max_model_len:
        raise BenchmarkError(f"--prompt-len {args.prompt_len} + --new-tokens {args.new_tokens} (and the profiled "
                             f"steps) exceed --max-model-len {args.max_model_len}")


def run(args: argparse.Namespace) -> int:
    check(args)
    with tempfile.TemporaryDirectory(prefix="infer-bench-model-") as scratch:
        folder, label = resolve_model(args.model, Path(scratch))
        settle_max_model_len(args, folder)
        check_lengths(args)
        common = {**base_spec(args, BENCHMARK, folder), "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                  "repeats": args.repeats, "profile_skip": args.profile_skip}
        specs = [{**common, "system": "infer", "attention": attention,
                  "engine_settings": engine_settings(args, attention)} for attention in (args.attention or [None])]
        specs += [{**common, "system": peer} for peer in PEERS if peer in args.peers]
        rows, device = run_systems(specs, args.timeout)
    add_floor_fractions(rows, "ms_per_token", higher_is_better=False)
    settings = {
        **common_settings(args, label),
        "batch": 1,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "greedy": True,
        "ignore_eos": True,
    }
    speculative = ("acceptance_rate", "mean_acceptance_length") if any("num_drafts" in r for r in rows) else ()
    print(format_rows(rows, ("output_tok_s", "ms_per_token", "ms_per_token_p50", "ttft_ms", *speculative)))
    return finish(args, BENCHMARK, device, settings, rows)
