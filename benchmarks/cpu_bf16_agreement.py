"""bfloat16 against float32 on the CPU, teacher-forced: how often the two engines pick the same next token.

The default model's float32 engine answers the chat workload's 32 questions greedily (``--new-tokens``
each, ``ignore_eos``); then both engines, float32 and bfloat16, predict every position of those answers
from the float32 text before it (each prefix a 1-token request; the prefix cache serves the shared part).
The figure is the share of positions where the bfloat16 engine's greedy token equals the float32
engine's. The engine's default CPU dtype is bfloat16 only if the default model keeps at least
``THRESHOLD`` of them (``infer_core/platform.py``).

    python -m benchmarks.cpu_bf16_agreement [--model FOLDER] [--new-tokens 128] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from infer_core.bench.chat_workload import CHAT_NEW_TOKENS, QUESTIONS, chat_texts

THRESHOLD = 0.99


def forced_predictions(llm, prompts: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
    """For every answer position k, the engine's greedy token after ``prompt + answer[:k]``."""
    from infer_core import SamplingParams

    requests = [prompt + answer[:k] for prompt, answer in zip(prompts, answers) for k in range(len(answer))]
    outputs = llm.generate(requests, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
    tokens = [o.outputs[0].token_ids[0] for o in outputs]
    predictions, start = [], 0
    for answer in answers:
        predictions.append(tokens[start : start + len(answer)])
        start += len(answer)
    return predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: the embedded default model)")
    parser.add_argument("--new-tokens", type=int, default=CHAT_NEW_TOKENS, help="answer tokens per question")
    parser.add_argument("--out", type=Path, default=None, help="folder for the result JSON (default benchmarks/results)")
    args = parser.parse_args()
    from infer_core import LLM, SamplingParams

    started = time.perf_counter()
    reference = LLM(args.model, dtype="float32")
    tokenizer = reference.get_tokenizer()
    prompts = [tokenizer(t, add_special_tokens=False).input_ids for t in chat_texts(tokenizer, len(QUESTIONS))]
    free = reference.generate(prompts, SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True),
                              use_tqdm=False)
    answers = [list(o.outputs[0].token_ids) for o in free]
    float32 = forced_predictions(reference, prompts, answers)
    reference.shutdown()
    del reference
    candidate = LLM(args.model, dtype="bfloat16")
    bfloat16 = forced_predictions(candidate, prompts, answers)
    candidate.shutdown()
    positions = sum(map(len, answers))
    agree = sum(a == b for x, y in zip(float32, bfloat16) for a, b in zip(x, y))
    own = sum(a == b for x, y in zip(float32, answers) for a, b in zip(x, y))
    first_miss = [next((k for k, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(float32, bfloat16)]
    results = [{
        "system": "infer",
        "positions": positions,
        "bfloat16_agrees_with_float32": agree,
        "agreement": round(agree / positions, 5),
        "threshold": THRESHOLD,
        "passes": agree / positions >= THRESHOLD,
        "float32_forced_equals_float32_free": round(own / positions, 5),
        "first_disagreement_per_question": first_miss,
        "seconds": round(time.perf_counter() - started, 1),
    }]
    settings = {"model": args.model or "the default model (SmolLM2-135M-Instruct)", "num_prompts": len(prompts),
                "new_tokens": args.new_tokens, "torch_threads": torch.get_num_threads(),
                "method": "teacher-forced: each position of the float32 engine's greedy answers predicted by both "
                          "engines from the float32 text before it"}
    path = write_result("cpu-bf16-agreement", settings, results, args.out)
    print(f"bfloat16 agrees with float32 at {agree} of {positions} positions ({agree / positions:.2%}; "
          f"threshold {THRESHOLD:.0%}); float32 forced vs free {own / positions:.2%}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
