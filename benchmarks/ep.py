"""Expert parallelism on two GPUs: Qwen3-30B-A3B (dummy weights, bfloat16), one GPU against EP=2 and TP=2, same run.

Each configuration runs in a process of its own, one after the other, so each has the GPUs to itself:

- ``single``: the whole model on one GPU (CUDA graphs for decode);
- ``ep2``: ``expert_parallel_size=2`` (64 whole experts a GPU, attention split over both), the default dispatch,
  ``all_reduce`` (each GPU runs its experts on every token, the partial sums all-reduced, in every step; decode
  steps replayed from CUDA graphs; see plugins/parallel_ep/README.md);
- ``ep2-all-to-all``: the same experts with ``expert_parallel_dispatch="all_to_all"`` (eager steps on token slices
  with all-to-all dispatch and combine, decode steps replayed from CUDA graphs of the all-reduce path);
- ``tp2``: ``tensor_parallel_size=2`` (every expert's intermediate size split over both; CUDA graphs).

Two figures each, as ``benchmarks.tp`` measures them: batch-1 decode (a 128-token prompt, 256 new tokens,
greedy; ms per decode step, median of ``--repeats`` runs after a warm-up) and nano-vllm's offline workload
(output tokens per second; ``--num-prompts N`` runs the first N of its 256 prompts). The EP row also records the
experts' load (entries per rank, imbalance) rank 0 counted. The target of issue 27 (EP=2 offline throughput at
least 1.5x one GPU) is recorded next to the measured ratio, not enforced.

    python -m benchmarks.ep [--out DIR] [--num-prompts 256] [--repeats 3] [--only single,ep2,ep2-all-to-all,tp2]
    python -m benchmarks.ep --tiny --out /tmp/ep-dry-run   # a small Qwen3-MoE on the CPU: checks the script

Writes ``benchmarks/results/ep-<device>-<date>.json`` (or under ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from benchmarks.tp import measure_decode, measure_throughput

CONFIG = Path(__file__).parent / "configs" / "Qwen3-30B-A3B" / "config.json"
THROUGHPUT_TARGET = 1.5  # EP=2 offline throughput over one GPU's (issue 27)
RUNS = {
    "single": {},
    "ep2": {"expert_parallel_size": 2},  # the default dispatch, all_reduce
    "ep2-all-to-all": {"expert_parallel_size": 2, "expert_parallel_dispatch": "all_to_all"},
    "tp2": {"tensor_parallel_size": 2},
}


def tiny_config() -> dict:
    """The same architecture, small enough for a CPU dry run of the whole script."""
    return {**json.loads(CONFIG.read_text()), "vocab_size": 10240,  # the workload draws ids below 10000
            "hidden_size": 128, "intermediate_size": 256,
            "moe_intermediate_size": 64, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "torch_dtype": "float32"}


def run_one(args: argparse.Namespace) -> None:
    """Child process: build the engine for ``args.child``, measure, write its row."""
    from infer_core import LLM

    scratch = Path(args.scratch)
    settings = {"load_format": "dummy", "max_model_len": 2 * args.max_len, "seed": 0, **RUNS[args.child]}
    if args.tiny:
        settings.update(device="cpu", dtype="float32", kv_cache_gb=0.5)
    else:
        settings.update(dtype="bfloat16", gpu_memory_utilization=args.gpu_memory_utilization)
    started = time.perf_counter()
    llm = LLM(str(scratch / "model"), **settings)
    row = {
        "system": "infer",
        "run": args.child,
        "parallel": llm.engine.config.implementations["parallel"],
        "attention": llm.engine.config.implementations["attention"],
        "kv_blocks": llm.engine.num_kv_blocks,
        "startup_s": round(time.perf_counter() - started, 1),
    }
    print(f"[{args.child}] engine up in {row['startup_s']} s", flush=True)
    vocab = llm.engine.config.model.vocab_size
    row_file = scratch / f"row-{args.child}.json"
    row.update(measure_decode(llm, vocab, args.prompt_len, args.new_tokens, args.repeats))
    print(f"[{args.child}] decode {row['decode_ms_per_token']} ms/token", flush=True)
    row_file.write_text(json.dumps(row))  # kept if the throughput run is cut off by --timeout
    if args.num_prompts:
        row.update(measure_throughput(llm, args.num_prompts, args.max_len))
        print(f"[{args.child}] throughput {row['output_tok_s']} output tok/s", flush=True)
    communicator = getattr(getattr(llm.engine.executor, "parallel", None), "communicator", None)
    describe = getattr(communicator, "describe", None)
    if describe is not None and row["parallel"] == "ep" and describe()["num_dispatches"]:
        load = describe()
        row["expert_load"] = {k: load[k] for k in ("entries_per_rank", "tokens_per_rank", "imbalance")}
    row_file.write_text(json.dumps(row))
    llm.shutdown()


def run_child(name: str, scratch: str, argv: list[str], timeout: float) -> dict:
    """One configuration in a child process (and its workers), ended after ``timeout`` s."""
    command = [sys.executable, "-m", "benchmarks.ep", "--child", name, "--scratch", scratch, *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    child = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = child.wait(timeout=timeout)
        note = None if code == 0 else f"exited with code {code}"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        note = f"cut off after --timeout {timeout:.0f} s"
    row_file = Path(scratch) / f"row-{name}.json"
    if not row_file.is_file():
        return {"run": name, "failed": note or "no figures"}
    row = json.loads(row_file.read_text())
    if note is not None:
        row["incomplete"] = note
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder of the result JSON (default benchmarks/results)")
    parser.add_argument("--num-prompts", type=int, default=256, help="first N prompts of the workload; 0 skips")
    parser.add_argument("--repeats", type=int, default=3, help="decode-latency runs after the warm-up")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--only", default=",".join(RUNS), help=f"which runs, comma-separated: {', '.join(RUNS)}")
    parser.add_argument("--tiny", action="store_true", help="a small Qwen3-MoE on the CPU (dry run of the script)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds each run may take")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-len", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.max_len = min(args.max_len, 160)
        args.num_prompts = min(args.num_prompts, 8)
        args.new_tokens, args.repeats = min(args.new_tokens, 16), min(args.repeats, 1)
    if args.child is not None:
        run_one(args)
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        print(f"unknown runs {unknown}: choose among {', '.join(RUNS)}")
        return 2
    if not args.tiny and torch.cuda.device_count() < 2 and set(names) - {"single"}:
        print(f"every run but single needs 2 CUDA devices, found {torch.cuda.device_count()} (use --tiny for a CPU dry run)")
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ep-") as scratch:
        (Path(scratch) / "model").mkdir()
        config = tiny_config() if args.tiny else json.loads(CONFIG.read_text())
        (Path(scratch) / "model" / "config.json").write_text(json.dumps(config))
        for name in names:
            rows.append(run_child(name, scratch, argv if argv is not None else sys.argv[1:], args.timeout))
            print(json.dumps(rows[-1]), flush=True)
    by_name = {row["run"]: row for row in rows}
    base = by_name.get("single", {})
    for row in rows:
        if row is not base and "decode_ms_per_token" in row and "decode_ms_per_token" in base:
            row["decode_speedup_vs_single"] = round(base["decode_ms_per_token"] / row["decode_ms_per_token"], 3)
        if row is not base and "output_tok_s" in row and "output_tok_s" in base:
            row["throughput_vs_single"] = round(row["output_tok_s"] / base["output_tok_s"], 3)
    for name in ("ep2", "ep2-all-to-all"):
        if name in by_name:
            by_name[name]["throughput_target_vs_single"] = THROUGHPUT_TARGET
    settings = {
        "model": "Qwen3-MoE tiny (CPU dry run)" if args.tiny else "Qwen3-30B-A3B (dummy weights)",
        "dtype": "float32" if args.tiny else "bfloat16",
        "runs": {name: RUNS[name] for name in names},
        "decode": {"batch": 1, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats},
        "throughput": {"num_prompts": args.num_prompts, "max_len": args.max_len, "temperature": 0.6,
                       "ignore_eos": True},
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    path = write_result("ep", settings, rows, args.out)
    print(json.dumps(rows, indent=1))
    print(f"wrote {path}")
    return 0 if all("failed" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
