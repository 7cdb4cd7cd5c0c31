"""What structured outputs cost at batch 64: output tokens per second with every request held to a JSON schema,
against the same batch free (issue 29's bar: at most 10% lower).

Qwen3-0.6B's shape (``benchmarks/configs/Qwen3-0.6B``) with dummy weights, on a CUDA device, through
``LLM.generate``: 64 prompts of ``--prompt-len`` tokens, ``--max-tokens`` output tokens each, the
engine's defaults otherwise (CUDA graphs, overlapped scheduling). The schema is a list of records
with ``minItems`` high enough that no document can end before ``--max-tokens``, so every constrained
row is masked at every step and both batches generate the same number of tokens (the free one with
``ignore_eos``). That config folder has no tokenizer, and a grammar needs one whose tokens spell
JSON: a byte-level BPE tokenizer is trained here on synthetic JSON and text (``--vocab-size`` tokens; the
grammar covers those ids, and the model's logits past them are never allowed), or ``--tokenizer DIR`` names
a real one. The model's config is given that tokenizer's end and start tokens, as a model's own config and
tokenizer agree: Qwen's end token (151645) past a smaller tokenizer's ids made xgrammar take every id
between for a special token, and each accept about 36 times slower (the figures before this were measured so).

Each mode runs once to warm up (grammar compiled, graphs captured, kernels built), then
``--repeats`` times; the best run's tok/s is kept (the least disturbed). Rows are printed as JSON and
written to ``benchmarks/results`` unless ``--no-write``.

    python -m benchmarks.grammar_overhead [--repeats 3] [--temperature 1.0 0] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import commit, write_result

CONFIG = Path(__file__).parent / "configs" / "Qwen3-0.6B"
BATCH = 64
RECORD = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                   "active": {"type": "boolean"}},
    "required": ["name", "age", "email", "tags", "active"],
    "additionalProperties": False,
}


def schema(max_tokens: int) -> dict:
    """A list of records that cannot be complete in ``max_tokens`` tokens (a record takes well over one)."""
    return {"type": "array", "items": RECORD, "minItems": max_tokens}


def _words(rng: random.Random, count: int) -> list[str]:
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "qu", "zi", "an", "er", "in", "on", "st", "th"]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(count)]


def train_tokenizer(folder: Path, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer of about ``vocab_size`` tokens, trained on synthetic JSON records and text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    vocabulary = _words(rng, 20000)
    lines = []
    for _ in range(40000):
        words = rng.sample(vocabulary, 6)
        record = {"name": words[0].title(), "age": rng.randint(0, 120), "email": f"{words[1]}@{words[2]}.com",
                  "tags": words[3:5], "active": rng.random() < 0.5}
        lines.append(json.dumps([record], separators=(",", ":")))
        lines.append(" ".join(rng.sample(vocabulary, 12)) + f" {rng.randint(0, 10**6)}.")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                         "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return folder


def _prompts(tokenizer, prompt_len: int) -> list[list[int]]:
    """BATCH prompts of ``prompt_len`` ids each, cut from random words (the trained tokenizer makes whole words
    single tokens, so the text grows until it has enough ids)."""
    rng, num_words = random.Random(1), 8 * prompt_len
    while len(ids := tokenizer.encode(" ".join(_words(rng, num_words)), add_special_tokens=False)) < BATCH * prompt_len:
        num_words *= 2
    return [ids[i * prompt_len:(i + 1) * prompt_len] for i in range(BATCH)]


def _run(llm, prompts: list[list[int]], params) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)


def model_dir(tokenizer_dir: str, folder: Path) -> Path:
    """Qwen3-0.6B's config with the tokenizer's end and start tokens, written to ``folder``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = json.loads((CONFIG / "config.json").read_text())
    config["eos_token_id"] = tokenizer.eos_token_id
    config["bos_token_id"] = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def measure(args: argparse.Namespace, tokenizer_dir: str, model: Path) -> list[dict]:
    from infer_core import LLM, SamplingParams
    from infer_core.sampling_params import StructuredOutputs

    llm = LLM(str(model), tokenizer=tokenizer_dir, load_format="dummy", device="cuda",
              max_model_len=args.prompt_len + args.max_tokens + 16, max_num_seqs=BATCH)
    prompts = _prompts(llm.get_tokenizer(), args.prompt_len)
    spec = StructuredOutputs(json=schema(args.max_tokens))
    rows, tree = [], commit()
    for temperature in args.temperature:
        best = {}
        for mode in ("free", "json_schema"):
            params = [SamplingParams(temperature=temperature, seed=i, max_tokens=args.max_tokens,
                                     ignore_eos=mode == "free", structured_outputs=spec if mode != "free" else None)
                      for i in range(BATCH)]
            _run(llm, prompts, params)  # warm-up
            runs = [_run(llm, prompts, params) for _ in range(args.repeats)]
            assert all(tokens == BATCH * args.max_tokens for _, tokens in runs), runs
            best[mode] = max(tokens / seconds for seconds, tokens in runs)
            print(f"temperature {temperature}, {mode}: {best[mode]:.0f} tok/s "
                  f"(runs: {', '.join(f'{t / s:.0f}' for s, t in runs)})", flush=True)
        ratio = best["json_schema"] / best["free"]
        row = {"system": "infer", "commit": tree, "batch": BATCH, "temperature": temperature,
               "free_tok_s": round(best["free"], 1), "json_schema_tok_s": round(best["json_schema"], 1),
               "ratio": round(ratio, 4), "cost_pct": round(100 * (1 - ratio), 2), "within_10pct": ratio >= 0.9}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.profile:
        _profile(llm, prompts, spec, args)
    if args.profile_device:
        _profile_device(llm, prompts, spec, args)
    llm.shutdown()
    return rows


def _profile(llm, prompts, spec, args) -> None:
    """One constrained and one free run under cProfile: the host functions by own time, to ``args.profile``."""
    import cProfile
    import io
    import pstats

    from infer_core import SamplingParams

    with open(args.profile, "w") as out:
        for mode in ("json_schema", "free"):
            params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=mode == "free",
                                     structured_outputs=spec if mode != "free" else None) for i in range(BATCH)]
            profiler = cProfile.Profile()
            profiler.enable()
            seconds, tokens = _run(llm, prompts, params)
            profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(40)
            out.write(f"=== {mode}: {tokens / seconds:.0f} tok/s under the profiler\n{text.getvalue()}\n")


def _profile_device(llm, prompts, spec, args) -> None:
    """One constrained and one free run under torch.profiler: CUDA kernels and host ops by device time."""
    import torch

    from infer_core import SamplingParams

    with open(args.profile_device, "w") as out:
        for mode in ("json_schema", "free"):
            params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens, ignore_eos=mode == "free",
                                     structured_outputs=spec if mode != "free" else None) for i in range(BATCH)]
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                seconds, tokens = _run(llm, prompts, params)
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
            out.write(f"=== {mode}: {tokens / seconds:.0f} tok/s under the profiler\n{table}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0, 0.0])
    parser.add_argument("--vocab-size", type=int, default=32000, help="of the trained tokenizer")
    parser.add_argument("--tokenizer", help="a tokenizer folder to use instead of training one")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--profile-device", help="also profile one constrained and one free run's CUDA kernels "
                        "(torch.profiler) into this file")
    parser.add_argument("--profile", help="also profile one constrained and one free run (cProfile) into this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = args.tokenizer or str(train_tokenizer(Path(tmp), args.vocab_size))
        rows = measure(args, tokenizer_dir, model_dir(tokenizer_dir, Path(tmp) / "model"))
    settings = {"model": "Qwen3-0.6B shape, dummy weights, the tokenizer's end token", "batch": BATCH, "prompt_len": args.prompt_len,
                "max_tokens": args.max_tokens, "repeats": args.repeats,
                "tokenizer": args.tokenizer or f"byte-level BPE trained on synthetic JSON, {args.vocab_size} tokens",
                "schema": "array of records, minItems = max_tokens (every row masked at every step)",
                "figure": "output tokens / wall time of LLM.generate over the batch, best of the repeats"}
    if not args.no_write:
        print(write_result("grammar-overhead", settings, rows, args.out))


if __name__ == "__main__":
    main()
