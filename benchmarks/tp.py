"""Tensor parallelism on two GPUs: Qwen3-8B (dummy weights, bfloat16), TP=1 against TP=2, same run.

Three figures per tensor-parallel size, each size in a process of its own (one after the other,
so each has the GPUs to itself):

- accuracy: last-position logits of the same 16 prompts (16 to 512 random tokens: every input
  token is given, so no sampled token can make the two runs diverge); TP=2 must be within 2e-2
  relative (``||a - b|| / ||b||``) of TP=1 for every prompt;
- decode-latency: batch 1, a 128-token prompt, 256 new tokens, greedy: ms per decode step and
  tokens/s (the prefill step timed apart), median of ``--repeats`` runs after a warm-up;
- offline-throughput: nano-vllm's workload (``random.seed(0)``; 256 prompts of
  ``randint(100, 1024)`` tokens drawn by ``randint(0, 10000)``; then 256 output lengths
  ``randint(100, 1024)``; ``ignore_eos``; temperature 0.6; one warm-up request before the clock):
  output tokens per second. ``--num-prompts N`` runs the first N of the same 256 to save time.

- bfloat16 noise (``--fp32-reference``): the same logits at TP=1 in float32, so the TP=2 vs
  TP=1 gap can be set against TP=1's own bfloat16 error (``tp1_bf16_vs_fp32``,
  ``tp2_bf16_vs_fp32``); a correct split leaves TP=2 no further from float32 than TP=1;
- where the host time goes (``--profile-steps N``): N batch-1 decode steps of each size under
  ``torch.profiler`` (CPU and CUDA), the table of the ops with the most self CPU time printed
  to the log.
- which all-reduce ran (``all_reduce`` in each TP>1 row): the path the ranks chose at start (the
  one-shot kernel over symmetric memory for small messages, NCCL above; or NCCL and why) and the
  all-reduces rank 0 issued down each (a call captured in a CUDA graph counts once, not per
  replay), and the row-parallel outputs pushed as partial sums instead (``num_pushed``: batch-1 and -2
  decode, the tp plugin's ``pushed_layers.py``). ``--nccl-all-reduce`` turns symmetric memory off
  (``enable_symm_mem_all_reduce=False``) to measure NCCL alone; ``--no-push`` keeps the one-shot
  all-reduce at decode sizes too.

    python -m benchmarks.tp [--out DIR] [--num-prompts 256] [--repeats 3] [--fp32-reference] [--profile-steps 8]
    python -m benchmarks.tp --tiny --out /tmp/tp-dry-run   # a small model on the CPU: checks the script

Writes ``benchmarks/results/tp-<device>-<date>.json`` (or under ``--out``); exits 1 when the
logits are not within the tolerance. The target of the issue (TP=2 decode at least 1.6x TP=1)
is recorded next to the measured speed-up, not enforced.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from infer_core.bench.engine_runs import time_one_request
from infer_core.bench.workload import NUM_WORKLOAD_PROMPTS, offline_workload
from infer_core.testing import REAL_CONFIGS

QWEN3_8B = REAL_CONFIGS["Qwen3-8B"]

# --tiny: the same architecture, small enough for a CPU dry run of the whole script
TINY = {
    **QWEN3_8B,
    "vocab_size": 10240,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "torch_dtype": "float32",
}

LOGITS_RTOL = 2e-2
DECODE_TARGET = 1.6
NUM_WORKLOAD = NUM_WORKLOAD_PROMPTS


def workload(num_prompts: int, max_len: int = 1024) -> tuple[list[list[int]], list[int]]:
    """The nano-vllm offline workload, bit-exact for max_len=1024; the first ``num_prompts`` of it."""
    requests = offline_workload(num_prompts, max_len)
    return requests.prompts, requests.output_lens


ACCURACY_PROMPT_LENS = (16, 33, 64, 100, 128, 200, 256, 300, 17, 48, 90, 150, 222, 333, 400, 512)


def accuracy_prompts(vocab: int, max_len: int) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(vocab) for _ in range(min(n, max_len))] for n in ACCURACY_PROMPT_LENS]


# --- one tensor-parallel size, in its own process ------------------------------------------------


def measure_logits(llm, vocab: int, max_len: int) -> list[torch.Tensor]:
    from infer_core import SamplingParams
    from infer_core.testing import LogitsRecorder

    prompts = accuracy_prompts(vocab, max_len)
    with LogitsRecorder(llm.engine) as recorder:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    return [recorder.logits[o.request_id][0] for o in outputs]


def measure_decode(llm, vocab: int, prompt_len: int, new_tokens: int, repeats: int) -> dict:
    """Batch 1 through the engine's step loop: the prefill step timed apart from the decode steps."""
    from infer_core import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    rng = random.Random(2)
    prefill_s, decode_s = [], []
    for run in range(repeats + 1):  # run 0 warms up
        engine.add_request(f"decode-{run}", [rng.randrange(vocab) for _ in range(prompt_len)], params)
        start, first, end = time_one_request(engine, new_tokens)
        if run:
            prefill_s.append(first - start)
            decode_s.append((end - first) / (new_tokens - 1))
    ms = statistics.median(decode_s) * 1e3
    return {
        "decode_ms_per_token": round(ms, 3),
        "decode_tok_s": round(1e3 / ms, 1),
        "prefill_ms": round(statistics.median(prefill_s) * 1e3, 2),
        "decode_ms_per_token_runs": [round(s * 1e3, 3) for s in decode_s],
    }


def measure_throughput(llm, num_prompts: int, max_len: int) -> dict:
    from infer_core import SamplingParams

    prompts, output_lens = workload(num_prompts, max_len)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in output_lens]
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.6, max_tokens=16, ignore_eos=True), use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == sum(output_lens), f"produced {produced} tokens, expected {sum(output_lens)}"
    return {
        "output_tok_s": round(produced / elapsed, 1),
        "output_tokens": produced,
        "elapsed_s": round(elapsed, 2),
        "num_prompts": num_prompts,
    }


def profile_decode(llm, vocab: int, steps: int) -> None:
    """``steps`` batch-1 decode steps under torch.profiler; prints the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    from infer_core import SamplingParams

    engine = llm.engine
    rng = random.Random(3)
    engine.add_request("profile", [rng.randrange(vocab) for _ in range(128)],
                       SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True))
    engine.step()  # the prefill, outside the profile
    engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    print(f"--- profile of {steps} decode steps, rank 0 (self CPU time) ---", flush=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
    if torch.cuda.is_available():  # kernels replayed inside CUDA graphs are listed too
        print("--- the same steps by self CUDA time ---", flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30), flush=True)


def all_reduce_info(llm) -> dict | None:
    """Rank 0's communicator's account of its all-reduces (tensor-parallel runs only)."""
    parallel = getattr(llm.engine.executor, "parallel", None)
    describe = getattr(parallel.communicator, "describe", None) if parallel is not None else None
    return describe() if describe is not None else None


def run_one(args: argparse.Namespace) -> None:
    """Child process: build the engine for ``args.child`` ranks, measure, write JSON + logits."""
    from infer_core import LLM

    scratch = Path(args.scratch)
    config = TINY if args.tiny else QWEN3_8B
    settings = {
        "load_format": "dummy",
        "tensor_parallel_size": args.child,
        "max_model_len": 2 * args.max_len,
        "seed": 0,
    }
    settings["enable_symm_mem_all_reduce"] = not args.nccl_all_reduce  # the setting is off by default
    settings["enable_pushed_partial_sums"] = not args.no_push
    settings["pushed_partial_sums_mode"] = args.push_mode
    if args.attention:
        settings["attention"] = args.attention
    if args.tiny:
        settings.update(device="cpu", dtype="float32", kv_cache_gb=1.0)
    else:
        settings.update(dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization)
    started = time.perf_counter()
    llm = LLM(str(scratch / "model"), **settings)
    load_s = time.perf_counter() - started
    vocab = config["vocab_size"]
    row = {
        "system": "infer",
        "tensor_parallel_size": args.child,
        "attention": llm.engine.config.implementations["attention"],
        "parallel": llm.engine.config.implementations["parallel"],
        "kv_blocks": llm.engine.num_kv_blocks,
        "startup_s": round(load_s, 1),
    }
    print(f"[tp={args.child}] engine up in {load_s:.1f} s", flush=True)
    logits = measure_logits(llm, vocab, args.max_len)
    if args.logits_only:  # the float32 reference
        torch.save(torch.stack([x[:vocab] for x in logits]), scratch / "logits-fp32.pt")
        (scratch / "row-fp32.json").write_text(json.dumps(row))
        llm.shutdown()
        return
    torch.save(torch.stack([x[:vocab] for x in logits]), scratch / f"logits-tp{args.child}.pt")
    if args.profile_steps:
        profile_decode(llm, vocab, args.profile_steps)
    row.update(measure_decode(llm, vocab, args.prompt_len, args.new_tokens, args.repeats))
    row["all_reduce"] = all_reduce_info(llm)
    print(f"[tp={args.child}] decode {row['decode_ms_per_token']} ms/token; all-reduce {row['all_reduce']}", flush=True)
    row_file = scratch / f"row-tp{args.child}.json"
    row_file.write_text(json.dumps(row))  # kept if the throughput run is cut off by --timeout
    if args.num_prompts:
        row.update(measure_throughput(llm, args.num_prompts, args.max_len))
        row["all_reduce"] = all_reduce_info(llm)
        print(f"[tp={args.child}] throughput {row['output_tok_s']} output tok/s", flush=True)
        row_file.write_text(json.dumps(row))
    llm.shutdown()


def run_size(size: int, scratch: str, argv: list[str], timeout: float, fp32: bool = False) -> dict:
    """One tensor-parallel size in a child process (and its workers), ended after ``timeout`` s."""
    command = [sys.executable, "-m", "benchmarks.tp", "--child", str(size), "--scratch", scratch, *argv]
    if fp32:
        command += ["--dtype", "float32", "--logits-only"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    child = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = child.wait(timeout=timeout)
        note = None if code == 0 else f"exited with code {code}"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        note = f"cut off after --timeout {timeout:.0f} s"
    row_file = Path(scratch) / ("row-fp32.json" if fp32 else f"row-tp{size}.json")
    if not row_file.is_file():
        raise RuntimeError(f"TP={size}: the run {note} before its first figures")
    row = json.loads(row_file.read_text())
    if note is not None:
        row["incomplete"] = note
        print(f"[tp={size}] {note}; keeping the figures measured before", flush=True)
    return row


# --- the parent: both sizes, the comparison, the result file -------------------------------------


def compare_logits(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    rel = ((candidate - reference).norm(dim=-1) / reference.norm(dim=-1)).tolist()
    top1 = (candidate.argmax(-1) == reference.argmax(-1)).float().mean().item()
    return {
        "logits_max_rel_diff": float(f"{max(rel):.3e}"),
        "logits_rel_diffs": [float(f"{r:.3e}") for r in rel],
        "logits_top1_agreement": round(top1, 4),
        "logits_within_tolerance": max(rel) <= LOGITS_RTOL,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder of the result JSON (default benchmarks/results)")
    parser.add_argument("--tp", type=int, default=2, help="the tensor-parallel size compared with 1")
    parser.add_argument(
        "--num-prompts", type=int, default=NUM_WORKLOAD, help="first N prompts of the workload; 0 skips"
    )
    parser.add_argument("--repeats", type=int, default=3, help="decode-latency runs after the warm-up")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.8,
        help="below the engine's 0.9: the eager torch attention's decode copies are not profiled",
    )
    parser.add_argument("--tiny", action="store_true", help="a small Qwen3 on the CPU (dry run of the script)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=210,
        help="seconds each tensor-parallel size may take; a cut-off run keeps its earlier figures",
    )
    parser.add_argument(
        "--fp32-reference",
        action="store_true",
        help="also TP=1 in float32 (logits only): both sizes' bfloat16 error against it",
    )
    parser.add_argument(
        "--profile-steps", type=int, default=0, help="profile N decode steps of each size (torch.profiler)"
    )
    parser.add_argument(
        "--nccl-all-reduce",
        action="store_true",
        help="every all-reduce through NCCL (enable_symm_mem_all_reduce=False): the one-shot path's baseline",
    )
    parser.add_argument(
        "--no-push",
        action="store_true",
        help="with symmetric memory, the one-shot all-reduce at decode sizes too (enable_pushed_partial_sums=False)",
    )
    parser.add_argument("--push-mode", choices=("gemv", "sum", "all_reduce"), default="gemv",
                        help="who adds the pushed partial sums (pushed_partial_sums_mode)")
    parser.add_argument("--attention", default=None, help="attention backend of both sizes (default: the engine picks)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    parser.add_argument("--logits-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-len", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.max_len = min(args.max_len, 160)
        args.num_prompts = min(args.num_prompts, 8)
        args.new_tokens, args.repeats = min(args.new_tokens, 32), min(args.repeats, 1)
    if args.child is not None:
        run_one(args)
        return 0
    if not args.tiny and torch.cuda.device_count() < args.tp:
        print(f"needs {args.tp} CUDA devices, found {torch.cuda.device_count()} (use --tiny for a CPU dry run)")
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tp-") as scratch:
        (Path(scratch) / "model").mkdir()
        config = TINY if args.tiny else QWEN3_8B
        (Path(scratch) / "model" / "config.json").write_text(json.dumps(config))
        for size in (1, args.tp):
            rows.append(run_size(size, scratch, argv if argv is not None else sys.argv[1:], args.timeout))
        reference = torch.load(Path(scratch) / "logits-tp1.pt")
        candidate = torch.load(Path(scratch) / f"logits-tp{args.tp}.pt")
        fp32 = None
        if args.fp32_reference:
            run_size(1, scratch, argv if argv is not None else sys.argv[1:], args.timeout, fp32=True)
            fp32 = torch.load(Path(scratch) / "logits-fp32.pt").float()
    base, tp = rows
    tp.update(compare_logits(reference, candidate))
    if fp32 is not None:
        for row, logits in ((base, reference), (tp, candidate)):
            noise = compare_logits(fp32, logits.float())
            row["vs_fp32_max_rel_diff"] = noise["logits_max_rel_diff"]
            row["vs_fp32_rel_diffs"] = noise["logits_rel_diffs"]
            row["vs_fp32_top1_agreement"] = noise["logits_top1_agreement"]
    tp["decode_speedup_vs_tp1"] = round(base["decode_ms_per_token"] / tp["decode_ms_per_token"], 3)
    tp["decode_target_speedup"] = DECODE_TARGET
    if "output_tok_s" in base and "output_tok_s" in tp:
        tp["throughput_speedup_vs_tp1"] = round(tp["output_tok_s"] / base["output_tok_s"], 3)
    settings = {
        "model": "Qwen3 tiny (CPU dry run)" if args.tiny else "Qwen3-8B (dummy weights)",
        "dtype": "float32" if args.tiny else "bfloat16",
        "tensor_parallel_sizes": [1, args.tp],
        "decode": {"batch": 1, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats},
        "throughput": {
            "num_prompts": args.num_prompts,
            "max_len": args.max_len,
            "temperature": 0.6,
            "ignore_eos": True,
        },
        "logits_rtol": LOGITS_RTOL,
        "fp32_reference": args.fp32_reference,
        "symm_mem_all_reduce": not args.nccl_all_reduce,
        "pushed_partial_sums": not (args.nccl_all_reduce or args.no_push),
        "pushed_partial_sums_mode": args.push_mode,
        "attention": args.attention or "engine default",
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    path = write_result("tp", settings, rows, args.out)
    print(json.dumps(rows, indent=1))
    print(f"wrote {path}")
    verdict = "within" if tp["logits_within_tolerance"] else "NOT within"
    if fp32 is not None:
        print(
            f"bfloat16 vs TP=1 float32: TP=1 max {base['vs_fp32_max_rel_diff']}, "
            f"TP={args.tp} max {tp['vs_fp32_max_rel_diff']}"
        )
    print(
        f"logits: TP={args.tp} {verdict} {LOGITS_RTOL} of TP=1 (max {tp['logits_max_rel_diff']}); "
        f"decode speed-up {tp['decode_speedup_vs_tp1']}x (target {DECODE_TARGET}x)"
    )
    print(f"all-reduce at TP={args.tp}: {(tp.get('all_reduce') or {}).get('path')}")
    return 0 if tp["logits_within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
