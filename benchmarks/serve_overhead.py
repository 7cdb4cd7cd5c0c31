"""What the API server's process spends per output token: `infer bench serve` around a server started here,
with the CPU time of the server's process (its threads, not the engine core's process) read before and after.

The server's process has one core's worth of time for everything a stream needs (unpickling the core's
steps, detokenizing, stop strings, SSE chunks, the HTTP sends); at the engine's token rate that budget is
tens of microseconds a token. This measures it on any machine, where throughput alone would also measure
the core and the client sharing the CPU:

    python -m benchmarks.serve_overhead --start-server "--model M --tokenizer T" --concurrency 128 \
        --num-prompts 256 --input-len 512 --output-len 128 --json out.json [--py-spy stacks.txt]

Run as a file (``python benchmarks/serve_overhead.py``) it measures whatever ``infer_core`` is on the path,
so one copy of it measures another tree's server (benchmarks/serve_25c.sh).

Per load point: output tok/s, TTFT and ITL, and CPU seconds of the server's process, of the engine core's
and of the load generator's own (this process: the client reads and parses every streamed event), the
server's and the client's also per output token, the server's also per event streamed (a server behind its
core sends a stream's pending tokens as one event: fewer events per token, less CPU per token), and the
engine core's step timeline where the server serves one (bench/core_timeline.py). ``--py-spy`` samples the server's process during the load
points (``py-spy record --format raw``): the collapsed stacks, and the heaviest functions printed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from infer_core.bench.launch import LaunchedServer
from infer_core.bench.serve import benchmark
from infer_core.bench.serve_flags import add_arguments, config_from_args

try:
    from infer_core.bench.serve import run_client
except ImportError:  # a tree from before the client ran on uvloop: its own client, as its `infer bench serve`
    run_client = asyncio.run

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads, none of its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """utime + stime of a process's main thread (the server's event loop) and of its other threads together (the
    reader of the core's pipe, the outbox, the tokenizer pool: Python names no thread for the OS)."""
    found = {"event_loop": 0.0, "other_threads": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        found["event_loop" if int(tid) == pid else "other_threads"] += (int(fields[11]) + int(fields[12])) / _TICKS
    return found


def core_pids(server_pid: int) -> list[int]:
    """The server's descendants (forkserver, engine core), found through /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children[ppid].append(int(entry))
    found, todo = [], [server_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def summarize_stacks(path: Path, top: int = 25) -> list[tuple[str, float, float]]:
    """(function, self share, inclusive share) of py-spy's collapsed stacks, heaviest self first."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " " + f.split("/")[-1].split(":")[0].rstrip(")") for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    total = max(total, 1)
    return [(name, n / total, inclusive[name] / total) for name, n in own.most_common(top)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--py-spy", type=Path, help="sample the server's process; collapsed stacks here")
    parser.add_argument("--asyncio-client", action="store_true", help="the client on asyncio's own loop, not uvloop")
    args = parser.parse_args()
    config = config_from_args(args)
    if config.server_flags is None:
        parser.error("--start-server FLAGS is needed: this measures a server it starts")
    run = asyncio.run if args.asyncio_client else run_client
    server = LaunchedServer(config.server_flags)
    server.start()
    spy = None
    try:
        warm = replace(config, base_url=server.base_url, wait_ready_s=1800.0, concurrency=[1], request_rate=[],
                       num_prompts=1)
        run(benchmark(warm, server.check_running))  # ready and warm: the load points start hot
        pid = server.process.pid
        cores = core_pids(pid)
        if args.py_spy is not None:
            spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "--rate", "200", "--nonblocking",
                                    "-o", str(args.py_spy), "--pid", str(pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = []
        for index, load in enumerate(config.concurrency or [None]):
            # prompts of their own (a seed per load point): the same prompts again would hit the prefix cache
            point = replace(config, base_url=server.base_url, warmup=0, seed=config.seed + 1 + index,
                            concurrency=[load] if load is not None else [], wait_ready_s=0)
            threads_before = thread_cpu_seconds(pid)
            server_before, core_before, start = cpu_seconds(pid), sum(map(cpu_seconds, cores)), time.perf_counter()
            client_before = time.process_time()
            result = run(benchmark(point, server.check_running))
            wall = time.perf_counter() - start
            client_cpu = time.process_time() - client_before
            server_cpu = cpu_seconds(pid) - server_before
            core_cpu = sum(map(cpu_seconds, cores)) - core_before
            threads = {name: round(cpu - threads_before[name], 3) for name, cpu in thread_cpu_seconds(pid).items()}
            point_result = result.runs[0]
            tokens = point_result.total_output_tokens
            # events with text each request's client read: a server behind its core merges a stream's pending
            # outputs into one event, so CPU per token falls with fewer events per token; per event it does not
            chunks = sum(1 + len(r.itl) for r in point_result.records if r.is_ok)
            row = dict(load=point_result.load.name, wall_s=round(wall, 3), output_tokens=tokens,
                       output_tok_s=round(point_result.output_tok_s, 1), ttft_mean_ms=round(point_result.ttft_ms.mean, 2),
                       ttft_p99_ms=round(point_result.ttft_ms.p99, 2), itl_mean_ms=round(point_result.itl_ms.mean, 3),
                       server_cpu_s=round(server_cpu, 3), core_cpu_s=round(core_cpu, 3), client_cpu_s=round(client_cpu, 3),
                       server_cpu_us_per_token=round(server_cpu / tokens * 1e6, 2) if tokens else None,
                       client_cpu_us_per_token=round(client_cpu / tokens * 1e6, 2) if tokens else None,
                       events=chunks, tokens_per_event=round(tokens / chunks, 3) if chunks else None,
                       server_cpu_us_per_event=round(server_cpu / chunks * 1e6, 2) if chunks else None,
                       server_cpu_s_by_thread=threads, failed=point_result.num_failed,
                       core_timeline=getattr(point_result, "core_timeline", None),  # a tree that has one
                       result=point_result.as_row(config.label or "infer"))
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "result"}), flush=True)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        server.stop()
        server.wait_gone()
    if args.py_spy is not None and args.py_spy.exists():
        for name, own, inclusive in summarize_stacks(args.py_spy):
            print(f"{own:6.1%} self {inclusive:6.1%} incl  {name}")
    if args.json:
        import infer_core

        tree = Path(infer_core.__file__).parent.parent
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or None
        Path(args.json).write_text(json.dumps(dict(
            flags=shlex.join(config.server_flags), tree=str(tree), commit=commit, label=config.label,
            date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), cpus=os.cpu_count(), load_average=os.getloadavg(),
            python=sys.version.split()[0], rows=rows), indent=1))


if __name__ == "__main__":
    main()
