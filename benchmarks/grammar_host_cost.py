"""The host's work per step for grammar masks at batch 64, on this machine's CPU: what ``grammar_overhead`` pays
on the H100's host between the previous step's tokens and the sampler's launch.

The tokenizer and schema are ``benchmarks/grammar_overhead``'s (a byte-level BPE tokenizer trained on
synthetic JSON, ``--vocab-size`` tokens; a list of records no document can finish in ``--steps`` tokens), and
the grammar backend is built for Qwen3-0.6B's 151936 logit columns, as the engine builds it there (a tree
whose grammar covers only the tokenizer's ids has masks that much narrower). ``--rows`` requests each
follow the schema from its start, each step taking a random token its grammar allows (seeded, so every
variant sees the same tokens).

Figures per step, in microseconds (median and mean over ``--steps`` steps after ``--warmup``):

- ``row_at_a_time``: the work as one loop over rows does it, split into its phases: each row's matcher
  accepts its pending token (``accept``), a fresh bitmask full of ones (``alloc``), each row's mask written
  (``fill``), rows and bitmask to the device (``copy``; on the CPU only the staging, no transfer);
- ``batched``, per thread count (``--threads``): the step's matchers accept in one call (``accept``), and
  fill their rows of a kept buffer in one call (``fill``), as the xgrammar backend's ``accept_each`` and
  ``fill_bitmasks`` do them;
- ``grammar_masks``, per thread count: the runner's masks end to end (runner/grammar_masks.py), as the tree
  has them, over the same requests in ``RequestState``s with the pending token in the previous step's ids
  (overlapped scheduling's steady state): the time ``build`` takes on the step loop's thread.

The runner's code is imported from the path, so ``PYTHONPATH=<other tree> python benchmarks/grammar_host_cost.py``
measures another tree's (one without the batched calls: ``batched`` is left out, the threads do not apply).

    python -m benchmarks.grammar_host_cost [--rows 64] [--steps 200] [--threads 1 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import commit, write_result
from benchmarks.grammar_overhead import schema, train_tokenizer

LOGITS = 151936  # Qwen3-0.6B's LM head rows


def _constraint(tokenizer_dir: str, max_tokens: int):
    from transformers import AutoTokenizer

    from infer_core.builtin.grammar_xgrammar import XGrammarBackend
    from infer_core.sampling_params import StructuredOutputs

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    backend = XGrammarBackend(None, tokenizer, LOGITS, [tokenizer.eos_token_id])
    return backend.compile(StructuredOutputs(json=schema(max_tokens)))


def _pick(bitmask: torch.Tensor, rng: np.random.Generator) -> list[int]:
    """A random allowed token per row of ``bitmask`` (not timed)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :LOGITS]
    return [int(rng.choice(np.flatnonzero(row))) for row in bits]


def _words(matcher) -> int:
    """The bitmask's words for ``matcher``: its ``vocab_size`` (a tree with the narrower masks), else the logits'."""
    return -(-(getattr(matcher, "vocab_size", None) or LOGITS) // 32)


def _summary(samples_ns: list[int]) -> dict:
    us = [s / 1000 for s in samples_ns]
    return {"median_us": round(statistics.median(us), 1), "mean_us": round(statistics.fmean(us), 1)}


def row_at_a_time(constraint, rows: int, steps: int, warmup: int, seed: int) -> dict:
    """The per-row loop's phases, timed apart."""
    from infer_core.runner.sampling_inputs import to_device

    matchers = [constraint.matcher() for _ in range(rows)]
    rng = np.random.default_rng(seed)
    device = torch.device("cpu")
    words = _words(matchers[0])
    phases: dict[str, list[int]] = {"accept": [], "alloc": [], "fill": [], "copy": [], "total": []}
    pending: list[int] | None = None
    for step in range(warmup + steps):
        t0 = time.perf_counter_ns()
        if pending is not None:
            for matcher, token in zip(matchers, pending):
                assert matcher.is_terminated or matcher.accept(token)
        t1 = time.perf_counter_ns()
        bitmask = torch.full((rows, words), -1, dtype=torch.int32)
        t2 = time.perf_counter_ns()
        for i, matcher in enumerate(matchers):
            if not matcher.is_terminated:
                matcher.fill_bitmask(bitmask, i)
        t3 = time.perf_counter_ns()
        to_device(np.arange(rows, dtype=np.int64), device), to_device(bitmask.numpy(), device)
        t4 = time.perf_counter_ns()
        if step >= warmup:
            for name, ns in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                phases[name].append(ns)
        pending = _pick(bitmask, rng)
    return {name: _summary(samples) for name, samples in phases.items()}


def batched(constraint, rows: int, steps: int, warmup: int, seed: int) -> dict:
    """The batched calls' phases, timed apart."""
    matchers = [constraint.matcher() for _ in range(rows)]
    cls = type(matchers[0])
    rng = np.random.default_rng(seed)
    indices = list(range(rows))
    bitmask = torch.empty((rows, _words(matchers[0])), dtype=torch.int32)
    phases: dict[str, list[int]] = {"accept": [], "fill": [], "total": []}
    pending: list[int] | None = None
    for step in range(warmup + steps):
        t0 = time.perf_counter_ns()
        if pending is not None:
            assert all(cls.accept_each(matchers, pending))
        t1 = time.perf_counter_ns()
        cls.fill_bitmasks(matchers, bitmask, indices)
        t2 = time.perf_counter_ns()
        if step >= warmup:
            for name, ns in zip(phases, (t1 - t0, t2 - t1, t2 - t0)):
                phases[name].append(ns)
        pending = _pick(bitmask, rng)
    return {name: _summary(samples) for name, samples in phases.items()}


def _masks(device: torch.device):
    """The tree's masks: build(table, states, last_step, last_sample_rows)."""
    try:
        from infer_core.runner.grammar_masks import GrammarMasks
    except ImportError:  # a tree before the kept buffers: one function
        from infer_core.runner import constraints

        return lambda table, states, last_step, rows: constraints.grammar_masks(table, states, LOGITS, device,
                                                                                last_step, rows)
    return GrammarMasks(LOGITS, device).build


def runner_masks(constraint, rows: int, steps: int, warmup: int, seed: int) -> dict:
    """The runner's masks end to end over ``rows`` requests in overlapped scheduling's steady state: the time
    ``build`` takes on the step loop's thread."""
    from infer_core.interfaces import NewRequestData, SchedulerOutput
    from infer_core.layers.sampler import SamplerOutput
    from infer_core.runner.state import RequestTable
    from infer_core.runner.step_output import SampledStep
    from infer_core.sampling_params import SamplingParams

    table = RequestTable(rows)
    params = SamplingParams()
    ids = [f"r{i}" for i in range(rows)]
    table.apply(SchedulerOutput(new_requests=[NewRequestData(rid, [1], 1, params, [], 1, constraint) for rid in ids]))
    states = [table[rid] for rid in ids]
    sample_rows = {rid: i for i, rid in enumerate(ids)}
    rng = np.random.default_rng(seed)
    build = _masks(torch.device("cpu"))
    samples: list[int] = []
    last_step = None
    for step in range(warmup + steps):
        t0 = time.perf_counter_ns()
        masks = build(table, states, last_step, sample_rows)
        t1 = time.perf_counter_ns()
        if step >= warmup:
            samples.append(t1 - t0)
        assert masks is not None and masks[1].shape[0] == rows
        tokens = _pick(masks[1], rng)
        for state in states:  # the engine has been sent the previous pending token; this step's is pending
            if state.num_pending_tokens:
                state.token_ids.append(int(last_step.token_ids[sample_rows[state.request_id]]))
            state.num_pending_tokens = 1
        last_step = SampledStep(ids, list(range(rows)), states, SamplerOutput(token_ids=torch.tensor(tokens)))
    return _summary(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--vocab-size", type=int, default=32000, help="of the trained tokenizer")
    parser.add_argument("--tokenizer", help="a tokenizer folder to use instead of training one")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="of the batched fill")
    parser.add_argument("--label", default="", help="what tree this is (before/after), kept in the row")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = args.tokenizer or str(train_tokenizer(Path(tmp), args.vocab_size))
        constraint = _constraint(tokenizer_dir, args.warmup + args.steps + 16)
    row = {"label": args.label, "commit": commit(), "rows": args.rows,
           "row_at_a_time": row_at_a_time(constraint, args.rows, args.steps, args.warmup, seed=0)}
    matcher_class = type(constraint.matcher())
    run = (constraint, args.rows, args.steps, args.warmup)
    if "fill_bitmasks" in vars(matcher_class):  # a tree with the batched calls: per thread count
        for threads in args.threads:
            matcher_class.threads = threads
            row[f"batched_{threads}_threads"] = batched(*run, seed=0)
            row[f"grammar_masks_{threads}_threads"] = runner_masks(*run, seed=0)
    else:
        row["grammar_masks"] = runner_masks(*run, seed=0)
    print(json.dumps(row), flush=True)
    settings = {"rows": args.rows, "threads": args.threads, "cpus": len(os.sched_getaffinity(0)), "steps": args.steps,
                "warmup": args.warmup, "logits": LOGITS,
                "tokenizer": args.tokenizer or f"byte-level BPE trained on synthetic JSON, {args.vocab_size} tokens",
                "schema": "benchmarks/grammar_overhead's: array of records, minItems past the steps",
                "figure": "host microseconds per step (median, mean) of the grammar masks' work"}
    if not args.no_write:
        print(write_result("grammar-host-cost", settings, [row], args.out))


if __name__ == "__main__":
    main()
