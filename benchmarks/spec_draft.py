"""Draft-model speculative decoding, batch 1: what a verify step and a draft step cost, and what that buys.

The target (Qwen3-8B's config by default) and the draft (Qwen3-0.6B's) load dummy weights. Measured,
on one engine with ``decoding="draft"`` and one request decoding greedily:

- **verify step**: the wall time of ``Engine.step`` while the request verifies k drafts (k = 1..8; the
  drafts are fixed tokens, so the draft model does not run), after 3 untimed steps of each k (a new
  shape's first launches); with each k's fastest and slowest step, and the runner's path for it: the
  verify graph (a batch-1 verify step of up to its token count, with an attention backend that has
  prefill graphs: triton, the default with a speculative policy) or eager (every kernel launched from
  Python: host-bound, several plain steps on an 8B target);
- **draft step**: the wall time of one proposal of k tokens by the draft model (its catch-up over the
  newest token, then k-1 more forwards; one-token forwards replay the draft's CUDA graphs);
- **end to end**: output tokens per second of ``generate`` with the draft policy (k up to ``--k-max``,
  adaptive), at the
  acceptance the dummy weights give, and of a plain engine (``decoding="standard"``, overlapped
  scheduling on) in the same process, after the draft engine is shut down.

The implied speed-up at per-token acceptance a (plugins/spec_decode/README.md): a step with k drafts
gains E(k, a) = (1 - a^(k+1)) / (1 - a) tokens and costs verify(k) + draft(k), so
speed-up(k, a) = E(k, a) * plain_step / (verify(k) + draft(k)); the table gives every k and the best.

    python -m benchmarks.spec_draft [--target DIR] [--draft DIR] [--load-format dummy] [--attention NAME] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from benchmarks.common import write_result

CONFIGS = Path(__file__).parent / "configs"


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 3)


def expected_tokens(k: int, a: float) -> float:
    """Tokens a verify step of k drafts gains when each draft is accepted with probability a (independently)."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def implied_speedups(plain_ms: float, verify_ms: dict[int, float], draft_ms: dict[int, float],
                     acceptances=(0.5, 0.7, 0.9)) -> dict[str, dict]:
    table = {}
    for a in acceptances:
        per_k = {k: round(expected_tokens(k, a) * plain_ms / (verify_ms[k] + draft_ms[k]), 3) for k in verify_ms}
        best = max(per_k, key=per_k.get)
        table[str(a)] = {"per_k": per_k, "best_k": best, "best_speedup": per_k[best]}
    return table


def verify_path(core, num_tokens: int) -> str:
    """What runs a batch-1 verify step of ``num_tokens`` tokens: the verify graph of some size, or eager."""
    runner = getattr(getattr(core.executor, "worker", None), "runner", None)
    graphs = getattr(runner, "graphs", None)
    if runner is None:
        return "unknown (not a single-device executor)"
    size = graphs.padded_verify_size(num_tokens) if graphs is not None else None
    return f"verify graph of {size} tokens" if size is not None else "eager"


def measure_steps(llm, k_max: int, steps: int) -> tuple[dict[int, float], dict[int, float], dict[int, dict]]:
    """(verify step ms by k, draft proposal ms by k, each k's verify path and spread), on one request of the
    draft engine."""
    from infer_core import SamplingParams
    from infer_core.interfaces import DraftRequest
    from infer_spec_decode.draft_policy import DraftDecoding

    class FixedDrafts(DraftDecoding):
        """k copies of one token for every decoding request: a verify step of k drafts, no draft model."""

        num_drafted = 1

        def propose(self, requests):
            drafts = {r.request_id: [7] * self.num_drafted for r in requests
                      if r.num_computed_tokens == r.num_tokens - 1}
            for r in requests:
                if r.request_id in drafts:
                    self._drafted(r)
            return drafts

    engine, core = llm.engine, llm.engine.core
    real = core.decoding
    fixed = FixedDrafts(real.ctx)
    fixed.bind(core.executor)
    params = SamplingParams(temperature=0, max_tokens=100_000, ignore_eos=True)
    engine.add_request("measure", list(range(100, 228)), params)
    engine.step()  # the prompt
    verify, draft, detail = {}, {}, {}
    try:
        core.decoding = fixed
        for k in range(1, k_max + 1):
            fixed.num_drafted = k
            times = []
            for i in range(steps + 3):
                start = time.perf_counter()
                engine.step()
                if i >= 3:
                    times.append(time.perf_counter() - start)
            verify[k] = median_ms(times)
            detail[k] = {"path": verify_path(core, k + 1), "min_ms": round(1000 * min(times), 3),
                         "max_ms": round(1000 * max(times), 3)}
        request = core.scheduler.get("measure")
        for k in range(1, k_max + 1):
            times = []
            for i in range(steps + 3):
                batch = [DraftRequest("measure", request.all_token_ids, k, request.num_preemptions)]
                start = time.perf_counter()
                core.executor.collective_rpc("propose_drafts", batch)  # its tokens reach the host: synchronised
                if i >= 3:
                    times.append(time.perf_counter() - start)
            draft[k] = median_ms(times)
    finally:
        core.decoding = real
        engine.abort("measure")
    return verify, draft, detail


def end_to_end(llm, new_tokens: int, repeats: int) -> dict:
    from infer_core import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompt = list(range(100, 228))
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)  # warm-up
    before = llm.engine.decoding.stats()
    start = time.perf_counter()
    outputs = [llm.generate([prompt], params, use_tqdm=False)[0].outputs[0] for _ in range(repeats)]
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    row = {"output_tokens": tokens, "seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
           "token_ids": outputs[0].token_ids}
    after = llm.engine.decoding.stats()
    if after is not None:
        drafted = after.num_draft_tokens - (before.num_draft_tokens if before else 0)
        accepted = after.num_accepted_tokens - (before.num_accepted_tokens if before else 0)
        drafts = after.num_drafts - (before.num_drafts if before else 0)
        row.update(num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
                   acceptance_rate=round(accepted / max(drafted, 1), 4),
                   mean_acceptance_length=round(1 + accepted / max(drafts, 1), 3))
    return row


def plain_step_ms(llm, steps: int) -> float:
    """The median wall time of one steady decode step of one request (overlapped scheduling as configured)."""
    from infer_core import SamplingParams

    engine = llm.engine
    engine.add_request("plain", list(range(100, 228)), SamplingParams(temperature=0, max_tokens=100_000,
                                                                       ignore_eos=True))
    times = []
    for i in range(steps + 5):
        start = time.perf_counter()
        engine.step()
        if i >= 5:
            times.append(time.perf_counter() - start)
    engine.abort("plain")
    while engine.has_unfinished_requests():
        engine.step()
    return median_ms(times)


def release(llm) -> None:
    import torch

    llm.shutdown()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=str(CONFIGS / "Qwen3-8B"))
    parser.add_argument("--draft", default=str(CONFIGS / "Qwen3-0.6B"))
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--k-max", type=int, default=8, help="num_speculative_tokens (the end-to-end run's too)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per k")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--attention", default=None,
                        help="both engines' attention backend (default: each engine's own default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from infer_core import LLM

    common = {"model": args.target, "load_format": args.load_format, "device": args.device,
              "max_model_len": args.max_model_len, "max_num_seqs": 8}
    if args.attention:
        common["attention"] = args.attention
    attention = {}
    def with_engine(run, **settings):
        llm = LLM(**common, **settings)
        attention[settings.get("decoding", "standard")] = llm.engine.config.implementations["attention"]
        try:
            return run(llm)
        finally:
            release(llm)  # its weights and KV cache freed before the next engine is built

    def draft_engine(llm):  # one engine for both: each start of the 8B target costs tens of seconds
        return (*measure_steps(llm, args.k_max, args.steps), end_to_end(llm, args.new_tokens, args.repeats))

    verify, draft, detail, spec = with_engine(draft_engine, decoding="draft", speculative_model=args.draft,
                                      num_speculative_tokens=args.k_max)
    print("verify step ms by k:", verify)
    print("verify step path and spread by k:", detail)
    print("draft proposal ms by k:", draft)
    plain, plain_ms = with_engine(lambda llm: (end_to_end(llm, args.new_tokens, args.repeats),
                                               plain_step_ms(llm, args.steps)))
    identical = spec.pop("token_ids") == plain.pop("token_ids")
    spec.update(identical_to_plain=identical, speedup=round(spec["output_tok_s"] / plain["output_tok_s"], 3))
    draft_forward_ms = round((draft[args.k_max] - draft[1]) / max(args.k_max - 1, 1), 3)
    implied = implied_speedups(plain_ms, verify, draft)
    print(f"plain step {plain_ms} ms, {plain['output_tok_s']} tok/s; draft k={args.k_max}: {spec['output_tok_s']} tok/s "
          f"(x{spec['speedup']}), acceptance {spec.get('acceptance_rate')}, identical {identical}")
    print(f"one more draft forward: {draft_forward_ms} ms")
    for a, row in implied.items():
        print(f"acceptance {a}: best k={row['best_k']} x{row['best_speedup']}  {row['per_k']}")
    settings = {"target": Path(args.target).name, "draft": Path(args.draft).name, "load_format": args.load_format,
                "batch": 1, "greedy": True, "prompt_len": 128, "new_tokens": args.new_tokens, "repeats": args.repeats,
                "k_max": args.k_max, "steps": args.steps, "device": args.device,
                "draft_cuda_graphs": "decode steps of up to 8 requests", "attention": attention}
    print("attention:", attention)
    results = [{"kind": "verify_step_ms", **{str(k): v for k, v in verify.items()}},
               {"kind": "verify_step_detail", **{str(k): v for k, v in detail.items()}},
               {"kind": "draft_proposal_ms", **{str(k): v for k, v in draft.items()},
                "one_more_draft_forward_ms": draft_forward_ms},
               {"kind": "plain", "step_ms": plain_ms, **plain},
               {"kind": "draft_end_to_end", **spec},
               {"kind": "implied_speedup", **implied}]
    print(write_result("spec-decode-draft", settings, results, args.out))


if __name__ == "__main__":
    main()
