"""Where a batch-1 decode step's time goes on a GPU: the graph alone, the host's parts, a cProfile.

``infer bench latency`` gives the step's wall time only. This runs the same engine (dummy weights,
CUDA graphs, greedy, ``ignore_eos``) and reports, per decode step:

- ``graph_us``: one decode graph replay at batch 1, back to back (the GPU's own time for the forward);
- ``step_us`` through ``Engine.step``, split into the host's parts (``host_overhead._clocks``): the
  scheduler, ``execute_async`` (input preparation and every launch; ``prepare``, ``sample`` and
  ``replay`` are parts of it), ``result`` (waiting for the
  step's tokens, then grouping them), ``update`` and ``process``; ``host_us`` is the step less the
  wait in ``result``, i.e. what the host itself spends;
- with ``--cprofile``, the functions with the most own time over ``--steps`` steps (cProfile slows
  Python down, so read it as shares, not times).

    python -m benchmarks.batch1_host --model benchmarks/configs/Qwen3-0.6B --attention triton --cprofile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from benchmarks.common import commit, write_result
from benchmarks.graph_kernels import replay_us
from benchmarks.host_overhead import _Clock, _clocks


def _part_clocks(engine) -> dict[str, _Clock]:
    """``host_overhead``'s clocks, plus the sampler launch and the graph replay inside ``execute_async``."""
    from infer_core.runner import model_runner

    clocks = _clocks(engine)
    clocks["sample"] = _Clock(model_runner, "sample")
    graphs = engine.executor.worker.runner.graphs
    if graphs is not None:
        clocks["replay"] = _Clock(graphs, "replay")
    return clocks


def _decode(engine, clocks: dict[str, _Clock], steps: int, prompt: list[int],
            profile: cProfile.Profile | None) -> tuple[float, dict]:
    """``steps`` decode steps of one request after its prefill; (µs per step, clocks' µs per step)."""
    from infer_core import SamplingParams

    engine.add_request("b1", prompt, SamplingParams(temperature=0, max_tokens=steps + 24, ignore_eos=True))
    for _ in range(12):
        engine.step()
    for clock in clocks.values():
        clock.seconds = 0.0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if profile is not None:
        profile.enable()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    engine.abort("b1")
    while engine.has_unfinished_requests():
        engine.step()
    parts = {name: round(clock.seconds / steps * 1e6, 1) for name, clock in clocks.items()}
    return total / steps * 1e6, parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="benchmarks/configs/Qwen3-0.6B")
    parser.add_argument("--attention", default="triton")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cprofile", action="store_true", help="also one run under cProfile: top 40 by own time")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from infer_core import LLM

    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", attention=args.attention, max_model_len=4096)
    engine = llm.engine
    runner = engine.executor.worker.runner
    vocab = engine.config.model.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(128)]
    graph_us = replay_us(runner.graphs, 1, 1000) if runner.graphs is not None else float("nan")
    clocks = _part_clocks(engine)
    rows = []
    for repeat in range(args.repeats):
        step_us, parts = _decode(engine, clocks, args.steps, prompt, None)
        waited = parts["result"]
        row = {"repeat": repeat, "graph_us": round(graph_us, 1), "step_us": round(step_us, 1),
               "host_us_without_result": round(step_us - waited, 1), **{f"{k}_us": v for k, v in parts.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.cprofile:
        profile = cProfile.Profile()
        step_us, _ = _decode(engine, clocks, args.steps, prompt, profile)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
        print(f"cProfile run: {step_us:.1f} us per step\n{text.getvalue()}", flush=True)
    settings = {"model": args.model, "attention": args.attention, "load_format": "dummy", "dtype": "bfloat16",
                "steps": args.steps, "greedy": True, "commit": commit()}
    llm.shutdown()
    print(write_result("batch1-host", settings, rows, args.out))


if __name__ == "__main__":
    main()
