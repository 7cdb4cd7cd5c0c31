"""Timing a GPU callable for the benchmarks: eager (``bench_ms``), as a CUDA-graph replay (``graph_ms``), and the
device-to-device copy bandwidth the bytes floors are taken against (``copy_bandwidth``)."""

from __future__ import annotations

import torch
import triton
import triton.testing


def bench_ms(fn) -> float:
    """Median milliseconds; L2 is flushed before every run, so reads come from HBM."""
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_ms(fn, reps: int = 50, l2_flush: str = "write") -> float:
    """Median milliseconds of ``fn`` replayed from a CUDA graph: no host launch cost; L2 flushed before each.

    ``l2_flush``: "write" zeroes 256 MiB before each replay, leaving L2 full of dirty lines that the replay's own
    misses must write back first; "read" sums 256 MiB instead, leaving it full of clean lines (as a decode step's
    L2 is: the layers before wrote only small activations)."""
    if l2_flush not in ("write", "read"):
        raise ValueError(f"l2_flush={l2_flush!r}: 'write' or 'read'")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiled and warm before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flush_read = flush.view(torch.float16).fill_(1.0) if l2_flush == "read" else None
    times = []
    for _ in range(reps):
        if flush_read is None:
            flush.zero_()
        else:
            flush_read.sum(dtype=torch.float32)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(sorted(times)[len(times) // 2])


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB: bytes read plus bytes written, per second."""
    src = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)
