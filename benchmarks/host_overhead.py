"""Host (Python) time of one decode step, without the model: what the engine costs around the GPU.

A tiny model (1 layer, vocab 2048) on the CPU, R requests all decoding (R = 1, 32, 256). The engine
launches a step with ``executor.execute_async`` and reads it later with ``.result()``; on the CPU the
forward and the sampler run inside ``execute_async``, together with the host's input preparation
(``build_step_inputs``, ``build_sampling_batch``). So each measured step's host time is
``Engine.step`` less ``execute_async``, plus the preparation timed inside it (``prepare``);
``result`` (grouping the sampled tokens per request), ``schedule``, ``update`` and ``process``
(the output processor) are timed on their own. Timers are wrapped around the engine's parts here,
in the benchmark; the engine is not edited.

Two ways of adding requests: ``stream`` as the server does (incremental text every step) and
``offline`` as ``LLM.generate`` does. The model folder gets the default model's tokenizer when
it is installed, so text is decoded as for a real model (the row says which tokenizer).

Each figure is the mean over ``--steps`` steps; the run is repeated ``--repeats`` times and the
smallest mean is kept (the machine may be shared: the minimum is the least disturbed run).

    python -m benchmarks.host_overhead [--out DIR] [--repeats 5] [--steps 64] [--temperature 0.6]
    PYTHONPATH=/tmp/host-before python -m benchmarks.host_overhead --label before --no-write
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import commit, write_result

NUM_RUNNING = (1, 32, 256)
PROMPT_LEN = 128
WARMUP_STEPS = 8  # decode steps after the prefill before the clock starts
PARTS = ("schedule", "update", "process", "prepare", "result", "execute_async")


def _tiny_model(folder: Path) -> tuple[Path, str | None]:
    """A 1-layer, vocab-2048 Qwen3 checkpoint with the default model's tokenizer if it is installed."""
    from infer_core.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3", folder / "model", vocab_size=2048, hidden_size=32, intermediate_size=64,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_hidden_layers=1,
                                max_position_embeddings=4096)
    try:
        from transformers import AutoTokenizer

        from infer_core.models.source import default_model_source

        source = default_model_source()
        AutoTokenizer.from_pretrained(str(source.path), gguf_file=source.gguf_file).save_pretrained(path)
        return path, source.name
    except Exception:  # no default model here: outputs carry token ids only
        return path, None


class _Clock:
    """Adds up the wall time of one bound method, replaced on its instance (or, with no owner, of
    whatever adds to ``seconds``)."""

    def __init__(self, owner=None, name: str = "") -> None:
        self.seconds = 0.0
        if owner is None:
            return
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(owner, name, timed)


class _LaunchClock(_Clock):
    """Times ``execute_async`` and, separately, the ``result()`` of each step it launched."""

    def __init__(self, executor, result_clock: _Clock) -> None:
        super().__init__(executor, "execute_async")
        launch = executor.execute_async

        def launched(*args, **kwargs):
            return _TimedPending(launch(*args, **kwargs), result_clock)

        executor.execute_async = launched


class _TimedPending:
    """A launched step whose ``result()`` adds its wall time to a clock."""

    def __init__(self, inner, clock: _Clock) -> None:
        self.inner, self.clock = inner, clock

    def result(self):
        start = time.perf_counter()
        try:
            return self.inner.result()
        finally:
            self.clock.seconds += time.perf_counter() - start


def _clocks(engine) -> dict[str, _Clock]:
    from infer_core.runner import model_runner

    result = _Clock()
    prepare = _Clock(model_runner, "build_step_inputs")
    sampling = _Clock(model_runner, "build_sampling_batch")
    return {"schedule": _Clock(engine.scheduler, "schedule"), "update": _Clock(engine.scheduler, "update"),
            "process": _Clock(engine.outputs, "process"), "prepare": prepare, "prepare_sampling": sampling,
            "result": result, "execute_async": _LaunchClock(engine.executor, result)}


def _add(engine, mode: str, prompt: list[int], params) -> str:
    request_id = engine.add_request(None, prompt, params)
    if mode == "offline":
        # As LLM.generate does; a tree from before final-only outputs has no such call, and there
        # LLM.generate streamed like the server (so the figure is still what LLM.generate cost).
        mark = getattr(engine.outputs, "mark_final_only", None)
        if mark is not None:
            mark(request_id)
    return request_id


def _one_run(engine, clocks: dict[str, _Clock], mode: str, num_running: int, steps: int, seed: int,
             temperature: float) -> dict:
    from infer_core import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(temperature=temperature, max_tokens=WARMUP_STEPS + steps + 8, ignore_eos=True)
    ids = [_add(engine, mode, [rng.randrange(3, 2048) for _ in range(PROMPT_LEN)], params)
           for _ in range(num_running)]
    while engine.scheduler.stats().num_waiting or any(
            engine.scheduler.get(i).num_computed_tokens < PROMPT_LEN for i in ids):
        engine.step()  # prefill
    for _ in range(WARMUP_STEPS):
        engine.step()
    gc.collect()
    for clock in clocks.values():
        clock.seconds = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - start
    for request_id in ids:
        engine.abort(request_id)
    for _ in range(2):  # an overlapped step still in flight is read (and dropped) by the next
        if engine.has_unfinished_requests():
            engine.step()
    assert not engine.has_unfinished_requests()
    per_step = {name: clock.seconds / steps * 1e6 for name, clock in clocks.items()}
    per_step["step"] = total / steps * 1e6
    per_step["prepare"] += per_step.pop("prepare_sampling")
    per_step["host"] = per_step["step"] - per_step["execute_async"] + per_step["prepare"]
    return per_step


def measure(label: str, repeats: int, steps: int, temperature: float = 0.0) -> tuple[list[dict], dict]:
    import torch

    from infer_core import LLM

    torch.set_num_threads(1)  # the forward is excluded anyway; one thread disturbs a shared machine least
    with tempfile.TemporaryDirectory() as tmp:
        path, tokenizer = _tiny_model(Path(tmp))
        llm = LLM(str(path), device="cpu", max_num_seqs=max(NUM_RUNNING), max_num_batched_tokens=16384,
                  max_model_len=PROMPT_LEN + WARMUP_STEPS + steps + 64, enable_prefix_caching=True)
        engine = llm.engine
        clocks = _clocks(engine)
        settings = {"model": "tiny qwen3: 1 layer, hidden 32, vocab 2048", "tokenizer": tokenizer,
                    "prompt_len": PROMPT_LEN, "warmup_decode_steps": WARMUP_STEPS, "measured_steps": steps,
                    "repeats": repeats, "temperature": temperature,
                    "block_size": engine.config.block_size, "enable_prefix_caching": True,
                    "figure": "µs per decode step, min over repeats of the mean over measured steps; "
                              "host_us = step_us - execute_async_us + prepare_us (prepare: build_step_inputs + "
                              "build_sampling_batch, run inside execute_async)",
                    "overlap": engine.overlap}
        rows, tree = [], commit()
        for mode in ("stream", "offline"):
            for num_running in NUM_RUNNING:
                runs = [_one_run(engine, clocks, mode, num_running, steps, r, temperature) for r in range(repeats)]
                row = {"system": "infer", "label": label, "commit": tree, "mode": mode, "num_running": num_running}
                for key in ("host", *PARTS, "step"):
                    row[f"{key}_us"] = round(min(run[key] for run in runs), 1)
                row["host_us_runs"] = [round(run["host"], 1) for run in runs]
                rows.append(row)
                print(json.dumps(row), flush=True)
        llm.shutdown()
    return rows, settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="after", help="names the tree measured (before/after a change)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature of every request (0: greedy; offline-throughput uses 0.6)")
    parser.add_argument("--merge", type=Path, help="a JSON of rows (from --rows-out) to put before this run's rows")
    parser.add_argument("--rows-out", type=Path, help="also write this run's rows alone to this file")
    parser.add_argument("--no-write", action="store_true", help="print rows only; write no result file")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the result JSON (default: benchmarks/results)")
    args = parser.parse_args()
    rows, settings = measure(args.label, args.repeats, args.steps, args.temperature)
    if args.rows_out:
        args.rows_out.write_text(json.dumps(rows, indent=2) + "\n")
    if args.merge:
        rows = json.loads(args.merge.read_text()) + rows
    if not args.no_write:
        print(write_result("host-overhead", settings, rows, args.out))


if __name__ == "__main__":
    main()
