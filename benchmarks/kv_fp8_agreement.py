"""FP8 KV cache against the model's dtype on a real model (CPU): teacher-forced top-1 agreement and greedy continuations.

The model is the embedded default (SmolLM2-135M-Instruct), run by the engine twice, with ``kv_cache_dtype``
auto and fp8 (scales 1.0: the checkpoint has none; ``--model`` may name a copy that has them), each in ``--dtype``. The text is real English prose
(``--text``; default: the GNU GPL v3, as Debian ships it), cut into ``--windows`` windows; each window is
cut again at ``--cuts`` lengths, and each cut is a prompt whose one next token is greedy: that token is
predicted from the prompt's K/V read back from the cache (prefill and prefix-cache hits), so the share of
cuts whose token agrees is a teacher-forced top-1 agreement. Then each window's greedy continuation of
``--new-tokens`` tokens: how many tokens agree, and where the first disagreement falls.

    python -m benchmarks.kv_fp8_agreement --out benchmarks/results
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import write_result

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")


def run(kv_cache_dtype: str, args, prompts: list[list[int]], windows: list[list[int]]):
    from infer_core import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, kv_cache_dtype=kv_cache_dtype, device="cpu", kv_cache_gb=1.0)
    try:
        greedy = SamplingParams(temperature=0, max_tokens=1)
        next_tokens = [o.outputs[0].token_ids[0] for o in llm.generate(prompts, greedy, use_tqdm=False)]
        cont = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
        continuations = [o.outputs[0].token_ids for o in llm.generate(windows, cont, use_tqdm=False)]
    finally:
        llm.shutdown()
    return next_tokens, continuations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: the embedded SmolLM2), e.g. "
                        "the same model with k_scale / v_scale tensors beside its weights")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--window-tokens", type=int, default=384)
    parser.add_argument("--cuts", type=int, default=16, help="prompts per window, of growing length")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from infer_core.testing import default_model_tokenizer

    tokenizer = default_model_tokenizer()
    ids = tokenizer.encode(args.text.read_text())
    step = max(args.window_tokens, (len(ids) - args.window_tokens) // args.windows)
    windows = [ids[i * step: i * step + args.window_tokens] for i in range(args.windows)]
    windows = [w for w in windows if len(w) == args.window_tokens]
    cut_len = args.window_tokens // args.cuts
    prompts = [w[: cut_len * (c + 1)] for w in windows for c in range(args.cuts)]
    base_next, base_cont = run("auto", args, prompts, windows)
    fp8_next, fp8_cont = run("fp8", args, prompts, windows)
    top1 = sum(a == b for a, b in zip(base_next, fp8_next)) / len(prompts)
    equal = sum(a == b for x, y in zip(base_cont, fp8_cont) for a, b in zip(x, y))
    parted = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(base_cont, fp8_cont)]
    row = {"teacher_forced_positions": len(prompts), "teacher_forced_top1_agreement": round(top1, 4),
           "greedy_tokens_equal": equal, "greedy_tokens": sum(map(len, base_cont)),
           "greedy_identical_continuations": sum(p == args.new_tokens for p in parted), "first_difference_at": parted}
    print(row, flush=True)
    if args.out is not None:
        settings = {"model": args.model or "SmolLM2-135M-Instruct (embedded default)", "dtype": args.dtype,
                    "text": str(args.text),
                    "windows": len(windows), "window_tokens": args.window_tokens, "cuts": args.cuts,
                    "new_tokens": args.new_tokens, "kv_scales": "the checkpoint's" if args.model else 1.0}
        print("wrote", write_result("kv-fp8-agreement", settings, [row], args.out), flush=True)


if __name__ == "__main__":
    main()
