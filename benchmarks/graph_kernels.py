"""What a decode CUDA graph's time is made of: per kernel, its own time and its share of the critical path.

With PDL a kernel starts before the one before it ends and waits inside (``fused/pdl.py``), so a
kernel's duration in a profile counts time spent waiting on its predecessor. What a kernel adds to
the step is how far it moves the end of the work done so far: ``max(0, end - latest end before it)``,
summed here per kernel name over the profiled replays (the ``adds_us`` column; its total is the
step's GPU time from the first kernel's start). Also the replay time without the profiler.

The engine is started as ``infer bench latency`` starts it (dummy weights, CUDA graphs); a request
decodes ``--context`` tokens first so the attention reads a real context, then the graph of
``--batch`` rows is replayed on the buffers that request's last step left.

    python -m benchmarks.graph_kernels --model benchmarks/configs/Qwen3-0.6B --attention triton --out DIR
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.common import commit, write_result


def replay_us(graphs, size: int, replays: int) -> float:
    for _ in range(10):
        graphs.replay(size)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graphs.replay(size)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / replays * 1e6


def critical_path(events: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """Per kernel name: calls, summed duration and summed critical-path increment (µs), from
    ``(name, start_us, end_us)`` sorted by start."""
    table: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "own_us": 0.0, "adds_us": 0.0})
    latest_end = None
    for name, start, end in events:
        row = table[name]
        row["calls"] += 1
        row["own_us"] += end - start
        row["adds_us"] += end - start if latest_end is None else max(0.0, end - max(latest_end, start))
        latest_end = end if latest_end is None else max(latest_end, end)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="benchmarks/configs/Qwen3-0.6B")
    parser.add_argument("--attention", default="triton")
    parser.add_argument("--batch", type=int, default=1, help="graph size replayed")
    parser.add_argument("--context", type=int, default=256, help="tokens decoded before the replays")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--quantization", default=None,
                        help="e.g. int8, fp8 (the quant_w8a8 plugin); unset: the checkpoint's, else none")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from infer_core import LLM, SamplingParams

    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", attention=args.attention, max_model_len=4096,
              quantization=args.quantization)
    engine = llm.engine
    graphs = engine.executor.worker.runner.graphs
    if graphs is None:
        raise SystemExit("no CUDA graphs in this engine (a CPU, or enforce_eager)")
    vocab = engine.config.model.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.context, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"r{i}", [(7 * t + i) % vocab for t in range(128)], params)
    while engine.has_unfinished_requests():
        engine.step()
    size = graphs.padded_size(args.batch)
    plain_us = replay_us(graphs, size, 500)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graphs.replay(size)
        torch.cuda.synchronize()
    kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e[1])
    table = critical_path(kernels)
    span_us = (kernels[-1][2] - kernels[0][1]) / args.replays if kernels else 0.0
    rows = [{"kernel": name, "calls_per_replay": row["calls"] / args.replays,
             "own_us": round(row["own_us"] / args.replays, 2), "adds_us": round(row["adds_us"] / args.replays, 2)}
            for name, row in sorted(table.items(), key=lambda kv: -kv[1]["adds_us"])]
    print(f"graph of {size} rows: {plain_us:.1f} us a replay without the profiler, {span_us:.1f} us with it")
    for row in rows[:25]:
        print(f"  {row['adds_us']:8.2f} us adds  {row['own_us']:8.2f} us own  {row['calls_per_replay']:6.1f} calls  "
              f"{row['kernel'][:90]}")
    settings = {"model": args.model, "quantization": args.quantization, "attention": args.attention,
                "batch": args.batch, "graph_size": size,
                "context": args.context, "replays": args.replays, "replay_us": round(plain_us, 1),
                "profiled_span_us": round(span_us, 1), "commit": commit()}
    llm.shutdown()
    print(write_result("graph-kernels", settings, rows, args.out))


if __name__ == "__main__":
    main()
