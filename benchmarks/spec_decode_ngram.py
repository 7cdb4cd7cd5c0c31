"""N-gram (prompt-lookup) speculative decoding against plain decoding, batch 1, on the default model.

Two chat workloads: *grounded* (repeat a paragraph with one change: the output copies its input)
and *free* (write freely: little to copy). Each prompt is generated greedily, one request at a
time, by an engine with ``decoding="standard"`` and by one with ``decoding="ngram"`` (k drafts a
step, prompt_lookup_min/max as set), in the same process. The figure is output tokens per second
of wall time over a workload (after a warm-up), the acceptance rate and mean acceptance length of
the drafts, the speed-up the n-gram engine's step count allows (its tokens over its steps: what it would reach if
a step with drafts cost what a plain one does), and whether the speculative tokens equal the plain ones (they
must: greedy).

    python -m benchmarks.spec_decode_ngram [--device cuda] [--new-tokens 256] [--k 4] [--dtype D] [--attention A]
        [--apart] [--serial] [--repeats N] [--profile STEPS] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.common import write_result

PARAGRAPHS = [
    "The old lighthouse stood at the edge of the cliff for more than a century. Every night its keeper climbed "
    "the spiral stairs, trimmed the wick and wound the clockwork that turned the great lens. Ships passing in the "
    "fog trusted its beam, and the village below slept soundly knowing it was there.",
    "To make bread, mix flour, water, salt and yeast in a large bowl until a shaggy dough forms. Knead it for ten "
    "minutes until it is smooth and elastic, then let it rise in a warm place for an hour. Shape the loaf, let it "
    "rise again, and bake it in a hot oven until the crust is deep brown.",
    "Photosynthesis is the process by which green plants turn light into chemical energy. Inside the leaves, "
    "chlorophyll absorbs sunlight, which drives the reaction that combines carbon dioxide and water into glucose. "
    "Oxygen is released as a by-product, and the glucose feeds the growth of the plant.",
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / "
    "len(values)\n\n\ndef variance(values):\n    m = mean(values)\n    total = 0\n    for value in values:\n"
    "        total += (value - m) ** 2\n    return total / len(values)\n",
]
CHANGES = ["the word 'old' replaced by 'ancient'", "'ten minutes' replaced by 'twelve minutes'",
           "'green plants' replaced by 'plants'", "the function 'mean' renamed to 'average' everywhere"]
FREE = ["Write a short story about a fox who learns to fly.", "Explain how the internet works to a child.",
        "Describe your ideal weekend in detail.", "Write a letter to a friend about a trip to the mountains."]


def workloads() -> dict[str, list[list[dict[str, str]]]]:
    grounded = [[{"role": "user", "content": f"Repeat the following text exactly, with {change}, and nothing "
                                             f"else:\n\n{text}"}] for text, change in zip(PARAGRAPHS, CHANGES)]
    free = [[{"role": "user", "content": prompt}] for prompt in FREE]
    return {"grounded": grounded, "free": free}


def run(decoding: str, args: argparse.Namespace) -> dict[str, dict]:
    from infer_core import LLM, SamplingParams

    settings = {"device": args.device, "decoding": decoding, "dtype": args.dtype}
    if args.attention:
        settings["attention"] = args.attention
    if decoding == "ngram":
        settings.update(num_speculative_tokens=args.k, prompt_lookup_min=args.min_n, prompt_lookup_max=args.max_n)
        if args.serial:
            settings["async_scheduling"] = False
    llm = LLM(**settings)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens)
    llm.chat(workloads()["free"][0], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)  # warm-up
    rows = {}
    for name, chats in workloads().items():
        before = llm.engine.decoding.stats()
        start = time.perf_counter()
        outputs = [llm.chat(chat, params, use_tqdm=False)[0].outputs[0]  # batch 1
                   for _ in range(args.repeats) for chat in chats]
        seconds = time.perf_counter() - start
        num_tokens = sum(len(o.token_ids) for o in outputs)
        row = {"decoding": decoding, "workload": name, "output_tokens": num_tokens, "seconds": round(seconds, 3),
               "output_tok_s": round(num_tokens / seconds, 1), "token_ids": [o.token_ids for o in outputs]}
        after = llm.engine.decoding.stats()
        if after is not None:
            drafted = after.num_draft_tokens - before.num_draft_tokens
            accepted = after.num_accepted_tokens - before.num_accepted_tokens
            drafts = after.num_drafts - before.num_drafts
            # every step that samples gives one token of the target's plus the drafts it kept (a prefill's last
            # step too): plain decoding takes a step a token, so equal step costs would give tokens / steps
            token_steps = num_tokens - accepted
            row.update(num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
                       acceptance_rate=round(accepted / max(drafted, 1), 4),
                       mean_acceptance_length=round(1 + accepted / max(drafts, 1), 3), token_steps=token_steps,
                       speedup_at_plain_step_cost=round(num_tokens / max(token_steps, 1), 3),
                       accepted_per_position=[a - b for a, b in zip(after.accepted_per_position,
                                                                    before.accepted_per_position)])
        rows[name] = row
    if args.profile:
        rows["grounded"]["profile"] = profile_grounded(llm, args)
    llm.shutdown()
    return rows


def profile_grounded(llm, args: argparse.Namespace) -> dict:
    """The step breakdown (host ranges, GPU busy) over the grounded workload's first prompt, its first steps."""
    from infer_core import SamplingParams
    from infer_core.bench.step_profile import format_breakdown, profile_steps

    engine = llm.engine
    text = engine.render_chat(workloads()["grounded"][0], True, None)
    engine.add_request("profiled", text, SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True),
                       add_special_tokens=False)
    for _ in range(3):  # the prefill and the first steps
        engine.step()
    breakdown = profile_steps(engine.step, args.profile)
    engine.abort("profiled")
    while engine.has_unfinished_requests():
        engine.step()
    print(format_breakdown(f"{engine.config.settings.decoding}, grounded", breakdown))
    return breakdown


def run_apart(decoding: str, args: argparse.Namespace) -> dict[str, dict]:
    """``run`` in a fresh process of its own: its engine's memory goes back with the process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run, decoding, args).result()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output position where two token lists differ (None when equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--min-n", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--max-n", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--dtype", default="auto", help="the model's dtype (auto: the device's default)")
    parser.add_argument("--attention", default=None, help="one attention backend for both engines (default: each "
                        "engine's own choice)")
    parser.add_argument("--apart", action="store_true", help="each engine in a process of its own")
    parser.add_argument("--serial", action="store_true", help="the n-gram engine plans each step after the one "
                        "before it has reported (async_scheduling off)")
    parser.add_argument("--repeats", type=int, default=1, help="each workload's prompts this many times over")
    parser.add_argument("--profile", type=int, default=0, help="then this many steps of a grounded prompt (greedy, "
                        "ignore_eos) under the profiler: host ranges and GPU busy a step")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    measure = run_apart if args.apart else run
    plain, spec = measure("standard", args), measure("ngram", args)
    results = []
    for name in plain:
        plain_ids, spec_ids = plain[name].pop("token_ids"), spec[name].pop("token_ids")
        identical = plain_ids == spec_ids
        speedup = round(spec[name]["output_tok_s"] / plain[name]["output_tok_s"], 3)
        spec[name].update(identical_to_plain=identical, speedup=speedup,
                          first_difference=[first_difference(a, b) for a, b in zip(plain_ids, spec_ids)])
        results += [plain[name], spec[name]]
        print(f"{name:9s} plain {plain[name]['output_tok_s']:8.1f} tok/s  ngram {spec[name]['output_tok_s']:8.1f} "
              f"tok/s  x{speedup:.2f}  (x{spec[name].get('speedup_at_plain_step_cost')} if a step cost a plain "
              f"one)  acceptance {spec[name].get('acceptance_rate')}  mean accepted length "
              f"{spec[name].get('mean_acceptance_length')}  identical {identical}  first difference per prompt "
              f"{spec[name]['first_difference']}")
    settings = {"model": "default (SmolLM2-135M-Instruct)", "batch": 1, "greedy": True, "new_tokens": args.new_tokens,
                "num_speculative_tokens": args.k, "prompt_lookup_min": args.min_n, "prompt_lookup_max": args.max_n,
                "device": args.device, "dtype": args.dtype, "attention": args.attention, "apart": args.apart,
                "prompts_per_workload": len(PARAGRAPHS),
                "serial": args.serial, "repeats": args.repeats}
    print(write_result("spec-decode-ngram", settings, results, args.out))


if __name__ == "__main__":
    main()
