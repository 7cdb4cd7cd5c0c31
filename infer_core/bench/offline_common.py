"""What ``infer bench throughput`` and ``infer bench latency`` share: the model, the options that
pick systems and engines, the spec each child gets, and the record at the end."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from infer_core.bench.config import BenchmarkError
from infer_core.real_configs import REAL_CONFIGS, write_config_checkpoint

DEFAULT_MODEL = "Qwen3-0.6B"
EMBEDDED = "default"  # --model default: the engine's embedded default model


def add_common_arguments(parser: argparse.ArgumentParser, peers: tuple[str, ...]) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"a name in benchmarks/configs ({', '.join(REAL_CONFIGS)}), a checkpoint "
                             f"folder with a config.json, or {EMBEDDED!r}: the embedded default model's dequantized "
                             f"copy in the user's cache (default {DEFAULT_MODEL})")
    parser.add_argument("--load-format", default="dummy", choices=("auto", "safetensors", "dummy"),
                        help="how infer reads the weights (default dummy: random values at the real shapes)")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (bf16), float16 (fp16) or float32 (fp32)")
    parser.add_argument("--attention", nargs="+", default=None, metavar="NAME",
                        help="attention backends to measure, each in a fresh engine (default: the engine's choice)")
    parser.add_argument("--peers", nargs="+", default=[], choices=peers, metavar="PEER",
                        help=f"other systems in the same run: {', '.join(peers)}")
    parser.add_argument("--enforce-eager", action="store_true", help="infer without CUDA graphs")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--max-num-seqs", type=int, default=256, help="infer's max_num_seqs (and the floor's)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="infer's max_num_batched_tokens (the prefill chunk budget; default: the engine's)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="infer's max_model_len (default 4096, or the model's limit where lower)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None, help="infer's share of GPU memory")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for <benchmark>-<device>-<date>.json (e.g. benchmarks/results)")
    parser.add_argument("--profile", action="store_true",
                        help="add a per-step time breakdown from torch.profiler to each infer row")
    parser.add_argument("--profile-steps", type=int, default=32, help="steps in the profiled window")
    parser.add_argument("--trace", type=Path, default=None, metavar="DIR",
                        help="with --profile, also write each profiled window's Chrome trace to DIR")
    parser.add_argument("--timeout", type=float, default=480, help="seconds each system may take")


DEFAULT_MAX_MODEL_LEN = 4096


def settle_max_model_len(args: argparse.Namespace, folder: str) -> None:
    """The default ``--max-model-len``: 4096, or the model's max_position_embeddings where lower."""
    if args.max_model_len is None:
        config = json.loads((Path(folder) / "config.json").read_text())
        args.max_model_len = min(DEFAULT_MAX_MODEL_LEN, int(config.get("max_position_embeddings") or 10**9))


def resolve_model(model: str, scratch: Path) -> tuple[str, str]:
    """(folder, label): a folder with a config.json as given, or a known name written into ``scratch``."""
    if model == EMBEDDED:  # the folder LLM() reads it from (written on its first start)
        from infer_core.models.gguf_cache import locate_model

        source = locate_model(None)
        if source.gguf_file is not None:
            raise BenchmarkError(f"--model {EMBEDDED}: its dequantized copy cannot be cached (the log says why); "
                                 "set INFER_CACHE_DIR to a writable folder")
        return str(source.path), source.name
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BenchmarkError(f"--model {model}: the folder has no config.json")
        return str(path.resolve()), path.name
    if model in REAL_CONFIGS:
        return str(write_config_checkpoint(model, scratch / model)), model
    raise BenchmarkError(f"--model {model!r} is neither a folder with a config.json nor a known model; "
                         f"known: {', '.join(REAL_CONFIGS)}, {EMBEDDED}")


def check_common(args: argparse.Namespace) -> None:
    from infer_core.settings import load_settings

    load_settings(dtype=args.dtype)  # the settings' own message for a bad dtype
    if args.profile_steps < 1:
        raise BenchmarkError(f"--profile-steps must be at least 1, got {args.profile_steps}")
    if args.trace and not args.profile:
        raise BenchmarkError("--trace needs --profile")
    if args.timeout <= 0:
        raise BenchmarkError(f"--timeout must be positive, got {args.timeout}")
    if args.attention is not None and len(set(args.attention)) != len(args.attention):
        raise BenchmarkError(f"--attention names a backend twice: {' '.join(args.attention)}")
    if args.attention:
        _check_attention_names(args.attention)


def _check_attention_names(names: list[str]) -> None:
    """Fail before any engine starts when a backend is not installed (the loader's message)."""
    from infer_core.loader import load_catalog
    from infer_core.settings import load_settings

    catalog = load_catalog(load_settings().plugins)
    for name in names:
        if catalog.get("attention", name) is None:
            raise catalog.unknown("attention", name)


def dtype_name(args: argparse.Namespace) -> str:
    from infer_core.settings import load_settings

    return load_settings(dtype=args.dtype).dtype


def base_spec(args: argparse.Namespace, benchmark: str, folder: str) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "folder": folder,
        "dtype": dtype_name(args),
        "device": args.device,
        "max_num_seqs": args.max_num_seqs,
        "profile": args.profile,
        "profile_steps": args.profile_steps,
        "trace_dir": str(args.trace.resolve()) if args.trace else None,
        "timeout_s": args.timeout,
        "log_level": args.log_level.upper() if hasattr(args, "log_level") else "INFO",
    }


def engine_settings(args: argparse.Namespace, attention: str | None) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "load_format": args.load_format,
        "dtype": dtype_name(args),
        "device": args.device,
        "enforce_eager": args.enforce_eager,
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "seed": 0,
    }
    if args.max_num_batched_tokens is not None:
        settings["max_num_batched_tokens"] = args.max_num_batched_tokens
    if attention is not None:
        settings["attention"] = attention
    if args.gpu_memory_utilization is not None:
        settings["gpu_memory_utilization"] = args.gpu_memory_utilization
    return settings


def common_settings(args: argparse.Namespace, model_label: str) -> dict[str, Any]:
    return {
        "model": model_label,
        "load_format": args.load_format,
        "dtype": dtype_name(args),
        "attention": args.attention,
        "peers": args.peers,
        "enforce_eager": args.enforce_eager,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "profile": args.profile,
        "env": {k: v for k, v in os.environ.items() if k.startswith("INFER_") and k != "INFER_API_KEY"},
    }


def finish(args: argparse.Namespace, benchmark: str, device: str, settings: dict[str, Any],
           rows: list[dict[str, Any]]) -> int:
    """Write the record (with --out), print the rows; 1 when any system failed."""
    from infer_core.bench.record import device_slug, write_results
    from infer_core.bench.step_profile import format_breakdown
    from infer_core.bench.timeline import format_timeline

    for row in rows:
        if "step_timeline" in row:
            print(format_timeline(f"{row['system']} attention={row.get('attention')}", row["step_timeline"],
                                  row.get("slowest_steps", []), row.get("compiled_during_run", [])))
        if "step_breakdown" in row:
            print(format_breakdown(f"{row['system']} attention={row.get('attention')}", row["step_breakdown"]))
    if hasattr(os, "getloadavg"):  # a shared machine's other work shows here (1, 5 and 15 minutes)
        settings = {**settings, "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    if args.out is not None:
        # another model's run of the same benchmark gets a file of its own: <benchmark>-<model>-<device>-<date>
        model = settings["model"]
        name = benchmark if model == DEFAULT_MODEL else f"{benchmark}-{device_slug(model)}"
        path = write_results(benchmark, device, settings, rows, args.out, name)
        print(f"wrote {path}")
    else:
        print(json.dumps(rows, indent=1))
    failed = [row for row in rows if "error" in row]
    for row in failed:
        print(f"error: {row['system']} {row.get('attention', '')}: {row['error']}")
    return 1 if failed else 0
