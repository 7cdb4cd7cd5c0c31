"""``infer bench throughput``: the offline-throughput benchmark (docs/benchmarks.md), infer and its peers.

A workload through ``LLM.generate`` once per ``--attention`` backend, each in a fresh process: the
nano-vllm one (:mod:`infer_core.bench.workload`, the default) or ``--workload chat``, 32 chat prompts
of ``--new-tokens`` greedy tokens (:mod:`infer_core.bench.chat_workload`, the CPU's). ``--peers
hf-generate-batch`` runs HF transformers' continuous batching on the first ``--peer-num-prompts``
requests (it is ~50x slower), ``--peers vllm`` vLLM's ``LLM.generate`` on the whole workload under
``--peer-python`` (:mod:`infer_core.bench.vllm_peer`), and ``--peers floor`` adds the physical floor
(:mod:`infer_core.bench.roofline`). Every system is a row of one record: output tokens per second of
wall time. Every process gets the workload's token ids from this one.

    infer bench throughput --attention flash triton torch --peers hf-generate-batch floor --out benchmarks/results
    infer bench throughput --model FOLDER --load-format auto --workload chat --dtype float32 \
        --peers vllm --peer-python /path/to/vllm-venv/bin/python --out benchmarks/results
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from infer_core.bench.chat_workload import CHAT_NEW_TOKENS, QUESTIONS, chat_workload
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
from infer_core.bench.workload import NUM_WORKLOAD_PROMPTS, WORKLOAD_MAX_LEN, OfflineWorkload, offline_workload

BENCHMARK = "offline-throughput"
PEERS = ("hf-generate-batch", "vllm", "floor")
WORKLOADS = ("nano-vllm", "chat")
# HF continuous batching is slow: by default it runs only the workload's first 32 requests.
DEFAULT_PEER_NUM_PROMPTS = 32


NANO_VLLM_MAX_NUM_BATCHED_TOKENS = 16384
WORKLOAD_DESCRIPTIONS = {
    "nano-vllm": "nano-vllm: random.seed(0); prompts randint(100, 1024) tokens of randint(0, 10000); "
                 "then output lengths randint(100, 1024); one warm-up request",
    "chat": "chat: the questions of infer_core.bench.chat_workload through the model's chat template, greedy, "
            "--new-tokens each; one warm-up request",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, PEERS)
    parser.add_argument("--workload", default="nano-vllm", choices=WORKLOADS,
                        help="nano-vllm (default: random token ids, sampled) or chat (32 chat prompts, greedy; needs "
                             "the model's tokenizer)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help=f"the first N requests of the workload (default all: {NUM_WORKLOAD_PROMPTS} for nano-vllm, "
                             f"{len(QUESTIONS)} for chat)")
    parser.add_argument("--new-tokens", type=int, default=CHAT_NEW_TOKENS,
                        help="--workload chat: tokens each prompt generates (default %(default)s)")
    parser.add_argument("--peer-python", default=None, metavar="PYTHON",
                        help="the interpreter --peers vllm runs under (default this one), e.g. a venv's bin/python")
    parser.add_argument("--peer-num-prompts", type=int, default=DEFAULT_PEER_NUM_PROMPTS,
                        help="the first N requests for hf-generate-batch (default %(default)s: about a minute)")
    parser.add_argument("--max-len", type=int, default=WORKLOAD_MAX_LEN,
                        help="longest prompt and output (default 1024, the real workload; less only for dry runs)")
    parser.add_argument("--profile-skip", type=int, default=32,
                        help="steps of the workload before the profiled window (past the prefills)")
    # nano-vllm's configuration for this workload (its Config default): prefill chunks of 16,384 tokens
    parser.set_defaults(max_num_batched_tokens=NANO_VLLM_MAX_NUM_BATCHED_TOKENS)


def check(args: argparse.Namespace) -> None:
    check_common(args)
    most = NUM_WORKLOAD_PROMPTS if args.workload == "nano-vllm" else len(QUESTIONS)
    if args.num_prompts is None:
        args.num_prompts = most
    for flag, value in (("--num-prompts", args.num_prompts), ("--peer-num-prompts", args.peer_num_prompts)):
        if not 1 <= value <= most:
            raise BenchmarkError(f"{flag} must be between 1 and {most} for --workload {args.workload}, got {value}")
    if args.new_tokens < 1:
        raise BenchmarkError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    if args.peer_python is not None and "vllm" not in args.peers:
        raise BenchmarkError("--peer-python is the interpreter of --peers vllm; add it, or drop --peer-python")
    if not 100 <= args.max_len <= WORKLOAD_MAX_LEN:
        raise BenchmarkError(f"--max-len must be between 100 and {WORKLOAD_MAX_LEN}, got {args.max_len}")
    if args.profile_skip < 0:
        raise BenchmarkError(f"--profile-skip must be 0 or more, got {args.profile_skip}")


def check_lengths(args: argparse.Namespace, workload: OfflineWorkload) -> None:
    """Once ``--max-model-len`` is known (its default depends on the model)."""
    if args.workload == "nano-vllm" and args.max_model_len < 2 * args.max_len:
        raise BenchmarkError(f"--max-model-len {args.max_model_len} cannot hold a {args.max_len}-token prompt and "
                             f"{args.max_len} output tokens; use at least {2 * args.max_len}")
    longest = max(len(p) + n for p, n in zip(workload.prompts, workload.output_lens))
    if args.max_model_len < longest:
        raise BenchmarkError(f"--max-model-len {args.max_model_len} cannot hold the workload's longest request "
                             f"({longest} tokens, prompt and output); use at least {longest}")


def build_workload(args: argparse.Namespace, folder: str) -> OfflineWorkload:
    if args.workload == "chat":
        return chat_workload(folder, args.num_prompts, args.new_tokens)
    return offline_workload(args.num_prompts, args.max_len)


def run(args: argparse.Namespace) -> int:
    check(args)
    with tempfile.TemporaryDirectory(prefix="infer-bench-model-") as scratch:
        folder, label = resolve_model(args.model, Path(scratch))
        settle_max_model_len(args, folder)
        workload = build_workload(args, folder)
        check_lengths(args, workload)
        common = {**base_spec(args, BENCHMARK, folder), "workload": workload.to_json(),
                  "profile_skip": args.profile_skip}
        specs = [{**common, "system": "infer", "attention": attention, "num_prompts": args.num_prompts,
                  "engine_settings": engine_settings(args, attention)} for attention in (args.attention or [None])]
        if "hf-generate-batch" in args.peers:
            specs.append({**common, "system": "hf-generate-batch", "num_prompts": args.peer_num_prompts})
        if "vllm" in args.peers:
            specs.append({**common, "system": "vllm", "num_prompts": args.num_prompts, "python": args.peer_python,
                          "max_model_len": args.max_model_len, "load_format": args.load_format})
        if "floor" in args.peers:
            specs.append({**common, "system": "floor", "num_prompts": args.num_prompts})
        rows, device = run_systems(specs, args.timeout)
    add_floor_fractions(rows, "output_tok_s", higher_is_better=True)
    settings = {
        **common_settings(args, label),
        "num_prompts": args.num_prompts,
        "peer_num_prompts": args.peer_num_prompts if "hf-generate-batch" in args.peers else None,
        "max_len": args.max_len if args.workload == "nano-vllm" else None,
        "output_tokens": workload.num_output_tokens,
        "prompt_tokens": workload.num_prompt_tokens,
        "temperature": workload.temperature,
        "ignore_eos": True,
        "workload": WORKLOAD_DESCRIPTIONS[args.workload],
        "peer_python": args.peer_python if "vllm" in args.peers else None,
    }
    print(format_rows(rows, ("output_tok_s", "num_prompts", "elapsed_s")))
    return finish(args, BENCHMARK, device, settings, rows)
