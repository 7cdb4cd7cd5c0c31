"""Host stalls of the step loop over a whole offline-throughput run: per-step parts and every GC pass.

The nano-vllm offline workload (256 requests, prompts and outputs of 100-1024 tokens, ``ignore_eos``,
temperature 0.6) through ``LLM.generate``, by default on a tiny model on the CPU (1 layer, vocab
2048; prompt token ids are taken modulo the vocabulary), so what is timed is the engine's Python.
Each step's ``schedule``, ``prepare`` (the runner's ``requests.apply``, ``build_step_inputs``,
``build_sampling_batch``), ``process`` (``accept`` + ``scheduler.update`` + output processor) and
``result`` are timed by wrappers put on the engine's parts here (the engine is not edited), and
within ``execute_async`` (the runner's whole launch, ``prepare`` included) also ``replay`` (the
CUDA-graph launch), ``sample`` and ``step_output`` (the sampled ids' copy to the host); and
every pass of Python's cyclic garbage collector by ``gc.callbacks``: its generation, duration, and
the step and part it fell in. A row gives p50/p99/max per part, GC passes per generation, and
the slowest steps of each part with the GC passes inside them.

    python -m benchmarks.host_stalls [--label after] [--out DIR | --no-write] [--rows-out F] [--merge F]
    python -m benchmarks.host_stalls --model benchmarks/configs/Qwen3-0.6B --device cuda --attention flash
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS

PARTS = ("schedule", "prepare", "process", "result", "execute_async", "replay", "sample", "step_output")
NUM_SLOWEST = 8  # slowest steps listed per part


class StepRecorder:
    """Times the engine's parts per step and every GC pass, attributed to the part it ran in."""

    def __init__(self, engine) -> None:
        from infer_core.runner import model_runner

        self.steps: list[dict[str, Any]] = []
        self.gc_passes: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.active: list[str] = []  # the parts running now, innermost last
        self._gc_start = 0.0
        self._origin = time.perf_counter()
        self.collector_in_run: dict[str, Any] = {}  # as the first step left it (the engine's busy settings)
        self._wrapped: list[tuple[Any, str, Any]] = []  # (owner, name, what was there), undone by close()
        runner = engine.executor.worker.runner if hasattr(engine.executor, "worker") else None
        self._wrap(engine, "step", "step")
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.decoding, "accept", "process")
        self._wrap(engine.scheduler, "update", "process")
        self._wrap(engine.outputs, "process", "process")
        self._wrap(model_runner, "build_step_inputs", "prepare")
        self._wrap(model_runner, "build_sampling_batch", "prepare")
        if runner is not None:
            self._wrap(runner.requests, "apply", "prepare")
            if runner.graphs is not None:  # inside execute_async: the CUDA-graph launch
                self._wrap(runner.graphs, "replay", "replay")
        self._wrap(model_runner, "sample", "sample")  # inside execute_async: the sampler's launches
        self._wrap(model_runner, "SampledStep", "step_output")  # the sampled ids' copy to the host
        recorder = self
        launch = engine.executor.execute_async

        def execute_async(*args, **kwargs):
            pending = recorder._timed("execute_async", launch, args, kwargs)
            return _TimedPending(pending, recorder)

        self._replace(engine.executor, "execute_async", execute_async)
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        """Stop recording and put every wrapped part back."""
        gc.callbacks.remove(self._on_gc)
        for owner, name, original in reversed(self._wrapped):
            if original is None:
                delattr(owner, name)  # the instance's own attribute goes; its class's method shows again
            else:
                setattr(owner, name, original)
        self._wrapped.clear()

    def _replace(self, owner, name: str, wrapper) -> None:
        own = vars(owner).get(name) if hasattr(owner, "__dict__") else None
        self._wrapped.append((owner, name, own))
        setattr(owner, name, wrapper)

    def _timed(self, part: str, inner, args, kwargs):
        step = self.current
        self.active.append(part)
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
            self.active.pop()
            if step is not None:
                step[part] = step.get(part, 0.0) + elapsed
                step[f"{part}_cpu"] = step.get(f"{part}_cpu", 0.0) + cpu

    def _wrap(self, owner, name: str, part: str) -> None:
        inner = getattr(owner, name)
        recorder = self

        def timed(*args, **kwargs):
            if part == "step":
                return recorder._step(inner, args, kwargs)
            return recorder._timed(part, inner, args, kwargs)

        self._replace(owner, name, timed)

    def _step(self, inner, args, kwargs):
        step = self.current = {"index": len(self.steps), "start_s": time.perf_counter() - self._origin}
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            step["step"] = time.perf_counter() - start
            self.steps.append(step)
            self.current = None
            if not self.collector_in_run:
                self.collector_in_run = {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        elapsed = time.perf_counter() - self._gc_start
        step = self.current
        part = self.active[-1] if self.active else ("step" if step is not None else "between steps")
        self.gc_passes.append({"generation": info["generation"], "ms": elapsed * 1e3, "collected": info["collected"],
                               "step": None if step is None else step["index"], "part": part,
                               "at_s": round(self._gc_start - self._origin, 4)})
        if step is not None:
            step["gc"] = step.get("gc", 0.0) + elapsed


class _TimedPending:
    """A launched step whose ``result()`` is timed as the ``result`` part of the step reading it."""

    def __init__(self, inner, recorder: StepRecorder) -> None:
        self.inner, self.recorder = inner, recorder

    def result(self):
        return self.recorder._timed("result", self.inner.result, (), {})


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "total_ms": 0.0}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50_ms": round(statistics.median(ordered) * 1e3, 3), "p99_ms": round(at(0.99) * 1e3, 3),
            "max_ms": round(ordered[-1] * 1e3, 3), "total_ms": round(sum(ordered) * 1e3, 1)}


def summarize(recorder: StepRecorder) -> dict[str, Any]:
    """Per part p50/p99/max over the steps, GC passes per generation, and the slowest steps of each
    host part with what ran in them."""
    steps, passes = recorder.steps, recorder.gc_passes
    summary: dict[str, Any] = {"num_steps": len(steps)}
    for part in ("step", *PARTS):
        summary[part] = _percentiles([s.get(part, 0.0) for s in steps])
    for part in ("schedule", "prepare", "process"):  # on a shared machine wall time also counts waits for a core
        summary[f"{part}_cpu"] = _percentiles([s.get(f"{part}_cpu", 0.0) for s in steps])
    summary["gc_per_step"] = _percentiles([s.get("gc", 0.0) for s in steps])
    by_generation = {}
    for generation in (0, 1, 2):
        ms = [p["ms"] for p in passes if p["generation"] == generation]
        by_generation[str(generation)] = {"count": len(ms), "total_ms": round(sum(ms), 1),
                                          "max_ms": round(max(ms, default=0.0), 3),
                                          "p50_ms": round(statistics.median(ms), 3) if ms else 0.0}
    summary["gc"] = by_generation
    summary["gc_ms_in_parts"] = {}
    for p in passes:
        summary["gc_ms_in_parts"][p["part"]] = round(summary["gc_ms_in_parts"].get(p["part"], 0.0) + p["ms"], 1)
    summary["gc_passes_over_10ms"] = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in p.items()}
                                      for p in passes if p["ms"] > 10.0]
    slowest = {}
    for part in ("schedule", "prepare", "process"):
        rows = []
        for step in sorted(steps, key=lambda s: -s.get(part, 0.0))[:NUM_SLOWEST]:
            inside = [p for p in passes if p["step"] == step["index"] and p["part"] == part]
            rows.append({"step": step["index"], "ms": round(step.get(part, 0.0) * 1e3, 3),
                         "cpu_ms": round(step.get(f"{part}_cpu", 0.0) * 1e3, 3),
                         "gc_ms": round(sum(p["ms"] for p in inside), 3),
                         "gc_generations": sorted({p["generation"] for p in inside})})
        slowest[part] = rows
    summary["slowest"] = slowest
    return summary


def _tiny_model(folder: Path) -> Path:
    from infer_core.testing import make_tiny_checkpoint

    return make_tiny_checkpoint("qwen3", folder / "model", vocab_size=2048, hidden_size=32, intermediate_size=64,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_hidden_layers=1,
                                max_position_embeddings=4096)


def _with_tokenizer(path: Path) -> str | None:
    """The default model's tokenizer saved next to the tiny model (text decoded as for a real model)."""
    from transformers import AutoTokenizer

    from infer_core.models.source import default_model_source

    source = default_model_source()
    AutoTokenizer.from_pretrained(str(source.path), gguf_file=source.gguf_file).save_pretrained(path)
    return source.name


def run(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from infer_core import LLM, SamplingParams
    from infer_core.bench.workload import WARMUP_MAX_TOKENS, WARMUP_PROMPT, WORKLOAD_TEMPERATURE, offline_workload

    if args.device == "cpu":
        torch.set_num_threads(1)  # the forward is not what is measured; one thread disturbs a shared machine least
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else _tiny_model(Path(tmp))
        tokenizer = _with_tokenizer(path) if args.tokenizer else None
        settings = {"device": args.device, "max_model_len": args.max_model_len, "max_num_seqs": 256}
        if args.model:
            settings.update(load_format=args.load_format, dtype=args.dtype)
        if args.attention:
            settings["attention"] = args.attention
        if args.block_size:
            settings["block_size"] = args.block_size
        llm = LLM(str(path), **settings)
        engine = llm.engine
        vocab = engine.config.model.vocab_size
        workload = offline_workload(args.num_prompts, args.max_len)
        prompts = [[t % vocab for t in p] for p in workload.prompts]
        # As infer bench throughput: the prompts' lengths once with other tokens (JIT shapes), one warm-up request.
        warmup = SamplingParams(temperature=WORKLOAD_TEMPERATURE, max_tokens=WARMUP_MAX_TOKENS, ignore_eos=True)
        llm.generate([[(t + 1) % vocab for t in p] for p in prompts], warmup, use_tqdm=False)
        llm.generate([WARMUP_PROMPT], warmup, use_tqdm=False)
        params = [SamplingParams(temperature=WORKLOAD_TEMPERATURE, ignore_eos=True, max_tokens=n)
                  for n in workload.output_lens]
        heap = len(gc.get_objects())
        recorder = StepRecorder(engine)
        start = time.perf_counter()
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        finally:
            recorder.close()
        elapsed = time.perf_counter() - start
        produced = sum(len(o.outputs[0].token_ids) for o in outputs)
        assert produced == workload.num_output_tokens, (produced, workload.num_output_tokens)
        row = {"system": "infer", "label": args.label, "tokenizer": tokenizer, "block_size": engine.config.block_size,
               "elapsed_s": round(elapsed, 3), "output_tokens": produced,
               "tracked_objects_before_run": heap, "gc_threshold_in_run": recorder.collector_in_run["threshold"],
               "frozen_objects_in_run": recorder.collector_in_run["frozen"], "overlap": engine.overlap,
               **summarize(recorder)}
        described = {"model": args.model or "tiny qwen3: 1 layer, hidden 32, vocab 2048", "tokenizer": tokenizer,
                     "num_prompts": args.num_prompts, "max_len": args.max_len, "temperature": WORKLOAD_TEMPERATURE,
                     "ignore_eos": True, "block_size": engine.config.block_size, **settings,
                     "workload": "nano-vllm: offline_workload(num_prompts, max_len), prompt ids modulo the vocabulary; "
                                 "warm-up as infer bench throughput; then LLM.generate timed"}
        llm.shutdown()
    return row, described


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="after", help="names the tree measured (before/after a change)")
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: a tiny qwen3 written here)")
    parser.add_argument("--load-format", default="dummy", help="with --model")
    parser.add_argument("--dtype", default="bfloat16", help="with --model")
    parser.add_argument("--attention", default=None)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--block-size", type=int, default=None, help="KV block size (flash-attn uses 256)")
    parser.add_argument("--tokenizer", action="store_true", help="give the model the default model's tokenizer")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=1024, help="longest prompt and output (workload: 1024)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--merge", type=Path, help="a JSON of rows (from --rows-out) to put before this run's row")
    parser.add_argument("--rows-out", type=Path, help="also write this run's row alone to this file")
    parser.add_argument("--no-write", action="store_true", help="print the row only; write no result file")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for host-stalls-<device>-<date>.json")
    args = parser.parse_args()
    row, described = run(args)
    print(json.dumps({k: v for k, v in row.items() if k != "slowest"}), flush=True)
    if args.rows_out:
        args.rows_out.write_text(json.dumps([row], indent=2) + "\n")
    if args.no_write:
        return
    from infer_core.bench.record import device_name, device_slug, git_commit, versions

    rows = (json.loads(args.merge.read_text()) if args.merge else []) + [row]
    device = device_name()
    date = dt.date.today().isoformat()
    slug = "cpu" if args.device == "cpu" else device_slug(device)
    record = {"benchmark": "host-stalls", "device": device, "date": date, "commit": git_commit(),
              "versions": versions(), "settings": described, "results": rows}
    path = args.out / f"host-stalls-{slug}-{date}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(path)


if __name__ == "__main__":
    main()
