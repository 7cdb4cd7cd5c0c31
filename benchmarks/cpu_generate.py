"""CPU figure of the core issue: the default model, 32 chat prompts, 128 new tokens each.

``LLM.generate`` against HF transformers ``generate`` (one left-padded batch of 32, greedy,
float32), same machine, same process, same prompts; output tokens per second of wall time,
each system timed ``--repeats`` times after a warm-up (the median is the figure; the spread
between runs says how large a difference is noise).

    python -m benchmarks.cpu_generate [--repeats 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from infer_core.bench.chat_workload import CHAT_NEW_TOKENS, QUESTIONS, chat_texts

NEW_TOKENS = CHAT_NEW_TOKENS


def _row(system: str, attention: str, tokens: int, seconds: list[float]) -> dict:
    rates = [tokens / s for s in seconds]
    return {"system": system, "attention": attention, "output_tokens": tokens,
            "seconds": [round(s, 3) for s in seconds], "runs_tok_s": [round(r, 1) for r in rates],
            "output_tok_s": round(statistics.median(rates), 1)}


def run_infer(texts: list[str], repeats: int) -> dict:
    from infer_core import LLM, SamplingParams

    llm = LLM()
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm.generate(texts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = llm.generate(texts, params, use_tqdm=False, add_special_tokens=False)
        seconds.append(time.perf_counter() - start)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.shutdown()
    return _row("infer", "torch", tokens, seconds)


def run_hf(texts: list[str], repeats: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infer_core.models.source import default_model_source

    source = default_model_source()
    tokenizer = AutoTokenizer.from_pretrained(str(source.path), gguf_file=source.gguf_file, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(source.path), gguf_file=source.gguf_file, dtype=torch.float32).eval()
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                  pad_token_id=tokenizer.pad_token_id)
    seconds = []
    with torch.no_grad():
        model.generate(**tokenizer(texts[:1], return_tensors="pt"), max_new_tokens=4, do_sample=False)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(**batch, **kwargs)
            seconds.append(time.perf_counter() - start)
    tokens = int((out.shape[1] - batch.input_ids.shape[1]) * out.shape[0])
    return _row("hf-generate", model.config._attn_implementation, tokens, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per system (the median is reported)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the result JSON (default benchmarks/results)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from infer_core.models.source import default_model_source

    source = default_model_source()
    tokenizer = AutoTokenizer.from_pretrained(str(source.path), gguf_file=source.gguf_file)
    texts = chat_texts(tokenizer, len(QUESTIONS))
    results = [run_infer(texts, args.repeats), run_hf(texts, args.repeats)]
    settings = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)", "num_prompts": len(texts),
                "new_tokens": NEW_TOKENS, "ignore_eos": True, "greedy": True, "dtype": "float32",
                "torch_threads": torch.get_num_threads(), "repeats": args.repeats}
    path = write_result("cpu-generate", settings, results, args.out)
    for row in results:
        print(f"{row['system']:<12} {row['output_tok_s']:>8.1f} tok/s median of {row['runs_tok_s']} "
              f"({row['output_tokens']} tokens per run)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
