"""Why a grammar's accept costs more inside the engine's run than alone: issue 29's open question.

``grammar_overhead``'s batch (64 requests, Qwen3-0.6B shape, dummy weights, a JSON schema on every row), run
through ``LLM.generate`` on a CUDA device while xgrammar's two batched calls are timed (wall clock, per call);
the token streams the run accepted are then replayed on fresh matchers in the same process with nothing else
running, so an accept that is slow in the run and fast in the replay is slow because of what runs beside it (the
GIL, the CPU's other threads), not because of the tokens. Variants of the run, one after the other: the
defaults, ``sys.setswitchinterval(1e-5)`` (a thread that took the GIL hands it back sooner), and torch's
intra-op threads set to 1. The Python threads alive during the run are listed. ``--qwen-end-token`` keeps the
config's end token past the tokenizer's ids (what made the accepts slow: xgrammar took the ids between for
special tokens).

    python -m benchmarks.grammar_accept_probe [--max-tokens 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.grammar_overhead import CONFIG as CONFIG_DIR
from benchmarks.grammar_overhead import BATCH, _prompts, model_dir, schema, train_tokenizer


class CallLog:
    """Wall time of every batched accept and fill, and the tokens each accept was given (by matcher)."""

    def __init__(self) -> None:
        self.accept_s: list[float] = []
        self.fill_s: list[float] = []
        self.streams: dict[int, list[int]] = {}
        self.order: list[int] = []  # matcher keys in the order they first accepted
        self.threads: set[str] = set()

    def summary(self) -> dict:
        def us(values):
            return {"calls": len(values), "median_us": round(1e6 * statistics.median(values), 1),
                    "mean_us": round(1e6 * statistics.fmean(values), 1)} if values else {}
        return {"accept": us(self.accept_s), "fill": us(self.fill_s), "threads": sorted(self.threads)}


def instrument(log_of: list[CallLog]) -> None:
    """Wrap the xgrammar backend's batched calls so each appends to ``log_of[0]``."""
    from infer_core.builtin import grammar_xgrammar as gx

    accept_each, fill_bitmasks = gx.XGrammarMatcher.accept_each.__func__, gx.XGrammarMatcher.fill_bitmasks.__func__

    def timed_accept(cls, matchers, token_ids):
        log = log_of[0]
        token_ids = list(token_ids)
        for m, t in zip(matchers, token_ids):
            if id(m) not in log.streams:
                log.streams[id(m)] = []
                log.order.append(id(m))
            log.streams[id(m)].append(t)
        log.threads.update(t.name for t in threading.enumerate())
        start = time.perf_counter()
        out = accept_each(cls, matchers, token_ids)
        log.accept_s.append(time.perf_counter() - start)
        return out

    def timed_fill(cls, matchers, bitmask, rows):
        start = time.perf_counter()
        fill_bitmasks(cls, matchers, bitmask, rows)
        log_of[0].fill_s.append(time.perf_counter() - start)

    gx.XGrammarMatcher.accept_each = classmethod(timed_accept)
    gx.XGrammarMatcher.fill_bitmasks = classmethod(timed_fill)


def replay(llm, spec, log: CallLog) -> dict:
    """The run's token streams accepted again by fresh matchers, one token per request per call, each step's rows
    filled after, with nothing else running: per-call times as in the run."""
    import torch

    from infer_core.builtin import grammar_xgrammar as gx

    constraint = llm.engine.core.constraints.compile(spec)
    streams = [log.streams[key] for key in log.order]
    matchers = [constraint.matcher() for _ in streams]
    bitmask = torch.empty((len(streams), -(-matchers[0].vocab_size // 32)), dtype=torch.int32)
    replayed = CallLog()
    for depth in range(max(len(s) for s in streams)):
        live = [i for i, s in enumerate(streams) if depth < len(s) and not matchers[i].is_terminated]
        if not live:
            break
        start = time.perf_counter()
        gx.XGrammarMatcher.accept_each([matchers[i] for i in live], [streams[i][depth] for i in live])
        replayed.accept_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        gx.XGrammarMatcher.fill_bitmasks([matchers[i] for i in live], bitmask, list(range(len(live))))
        replayed.fill_s.append(time.perf_counter() - start)
    return replayed.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--qwen-end-token", action="store_true", help="keep the config's end token (151645), past "
                        "the trained tokenizer's ids, as grammar_overhead did before")
    args = parser.parse_args()
    import torch

    from infer_core import LLM, SamplingParams
    from infer_core.sampling_params import StructuredOutputs

    log_of = [CallLog()]
    instrument(log_of)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = str(train_tokenizer(Path(tmp), 32000))
        model = CONFIG_DIR if args.qwen_end_token else model_dir(tokenizer_dir, Path(tmp) / "model")
        llm = LLM(str(model), tokenizer=tokenizer_dir, load_format="dummy", device=args.device,
                  max_model_len=args.prompt_len + args.max_tokens + 16, max_num_seqs=BATCH)
        prompts = _prompts(llm.get_tokenizer(), args.prompt_len)
        spec = StructuredOutputs(json=schema(args.max_tokens))

        def run(constrained: bool) -> float:
            params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=not constrained,
                                     structured_outputs=spec if constrained else None) for i in range(BATCH)]
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            return BATCH * args.max_tokens / (time.perf_counter() - start)

        run(False), run(True)  # warm-up: graphs, kernels, the grammar compiled
        free = run(False)
        threads = torch.get_num_threads()
        for name, setup in (("defaults", lambda: None), ("switchinterval 1e-5", lambda: sys.setswitchinterval(1e-5)),
                            ("torch threads 1", lambda: (sys.setswitchinterval(0.005), torch.set_num_threads(1)))):
            setup()
            log_of[0] = CallLog()
            tok_s = run(True)
            row = {"variant": name, "free_tok_s": round(free, 1), "json_tok_s": round(tok_s, 1),
                   "ratio": round(tok_s / free, 4), "in_run": log_of[0].summary(),
                   "replayed": replay(llm, spec, log_of[0])}
            rows.append(row)
            print(json.dumps(row), flush=True)
        torch.set_num_threads(threads)
        llm.shutdown()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
