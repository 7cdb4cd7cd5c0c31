"""Microseconds per tensor-parallel all-reduce by message size: NCCL against the one-shot symmetric-memory kernel.

    torchrun --standalone --nproc-per-node 2 -m infer_parallel_tp.bench_all_reduce [--out FILE.json]

bfloat16 messages from 8 KiB (one token of a 4096-wide hidden state) to ``--max-kib``: each path
timed eagerly (``--calls`` back to back) and replayed from a CUDA graph of a chain of 64
all-reduces (what a decode step's graph holds), by CUDA events on rank 0. Prints a table and the
largest size at which the one-shot kernel is still faster in graphs: the candidate for
``symm_mem.ONE_SHOT_MAX_BYTES``. ``--out`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from infer_parallel_tp.group import join_group, leave_group, torchrun_placement, torchrun_store
from infer_parallel_tp.symm_mem import OneShotAllReduce

CHAIN = 64  # all-reduces per captured graph


def _nccl(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def time_eager(reduce: Callable, x: torch.Tensor, calls: int) -> float:
    for _ in range(10):
        reduce(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        reduce(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def time_graph(reduce: Callable, x: torch.Tensor, replays: int) -> float:
    def chain() -> torch.Tensor:
        y = x.clone()
        for _ in range(CHAIN):
            y = reduce(y) * 0.5  # keeps the values bounded; the same elementwise work on both paths
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (replays * CHAIN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-kib", type=int, default=8192, help="largest message (and symmetric buffer), KiB")
    parser.add_argument("--calls", type=int, default=200, help="eager all-reduces timed per size")
    parser.add_argument("--replays", type=int, default=20, help="graph replays timed per size")
    parser.add_argument("--out", default=None, help="write the rows to this JSON file (rank 0)")
    args = parser.parse_args(argv)
    placement = torchrun_placement("cuda")
    if placement is None:
        print("run under torchrun: torchrun --standalone --nproc-per-node 2 -m infer_parallel_tp.bench_all_reduce")
        return 2
    join_group(placement, torchrun_store(placement), enable_symm_mem=False)
    one_shot, why = OneShotAllReduce.setup(placement.rank, placement.world_size, placement.local_rank,
                                           max_bytes=args.max_kib * 1024)
    if one_shot is None:
        print(f"no symmetric memory here: {why}", file=sys.stderr)
        leave_group()
        return 1
    device = torch.device("cuda", placement.local_rank)
    rows = []
    kib = 8
    while kib <= args.max_kib:
        x = torch.randn(kib * 512, device=device).to(torch.bfloat16)
        torch.testing.assert_close(one_shot(x), _nccl(x.clone()), rtol=0, atol=0)
        row = {"bytes": kib * 1024, "tokens_of_4096_bf16": kib // 8}
        for name, reduce in (("nccl", _nccl), ("one_shot", one_shot)):
            row[f"{name}_eager_us"] = round(time_eager(reduce, x.clone(), args.calls), 2)
            row[f"{name}_graph_us"] = round(time_graph(reduce, x, args.replays), 2)
        rows.append(row)
        kib *= 2
    if placement.rank == 0:
        print(f"world size {placement.world_size}, {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
        print(f"{'KiB':>6} {'nccl eager':>11} {'1-shot eager':>13} {'nccl graph':>11} {'1-shot graph':>13}  (us/op)")
        for r in rows:
            print(f"{r['bytes'] // 1024:>6} {r['nccl_eager_us']:>11} {r['one_shot_eager_us']:>13} "
                  f"{r['nccl_graph_us']:>11} {r['one_shot_graph_us']:>13}")
        faster = [r["bytes"] for r in rows if r["one_shot_graph_us"] < r["nccl_graph_us"]]
        print(f"one-shot faster in graphs up to {max(faster) // 1024 if faster else 0} KiB")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"benchmark": "tp-all-reduce", "device": torch.cuda.get_device_name(device),
                           "torch": torch.__version__, "world_size": placement.world_size, "rows": rows}, f, indent=1)
    del one_shot
    leave_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
