"""Sampling on one GPU: the previous torch sampler against the fused one, same inputs, same run.

The previous ``sampler.py`` and ``sampling_inputs.py`` are loaded from git (``--old-ref``, by
default the parent of the commit that introduced the fused path) into temporary modules. For
each case and batch size: ``sample_us`` (GPU time of ``sample`` on a built batch, CUDA events),
``build_us`` (host time of ``build_sampling_batch``) and ``step_us`` (host wall time of build +
sample + the one copy of the token ids to the host, as the runner does each step).

    python3 -m benchmarks.sampling [--out DIR] [--old-ref REF | --old-dir DIR] [--iters N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result  # noqa: E402
from infer_core import SamplingParams  # noqa: E402
from infer_core.layers import sampler as new_sampler  # noqa: E402
from infer_core.runner import sampling_inputs as new_inputs  # noqa: E402
from infer_core.runner.state import RequestState  # noqa: E402

VOCAB = 151936
ROWS = (1, 64, 256)
PROMPT_LEN, OUTPUT_LEN = 128, 256  # token histories for the penalties case
CASES = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.7),
    "top_k=50": dict(temperature=0.7, top_k=50),
    "top_p=0.9": dict(temperature=0.7, top_p=0.9),
    "top_k=50,top_p=0.9": dict(temperature=0.7, top_k=50, top_p=0.9),
    "min_p=0.05": dict(temperature=0.7, min_p=0.05),
    "seeded": dict(temperature=0.7, seed=1234),
    "penalties": dict(temperature=0.7, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5),
}


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def default_old_ref() -> str:
    added = _git("log", "--format=%H", "--diff-filter=A", "--", "infer_core/layers/sampling/philox.py").split()
    return f"{added[-1]}~1"


def load_old(ref: str, old_dir: Path | None = None) -> tuple[types.ModuleType, types.ModuleType]:
    """The sampler and its batch builder as they were at ``ref`` (or as saved in ``old_dir``), as fresh modules."""
    if old_dir is not None:
        sampler_source = (old_dir / "sampler.py").read_text()
        source = (old_dir / "sampling_inputs.py").read_text()
    else:
        sampler_source = _git("show", f"{ref}:infer_core/layers/sampler.py")
        source = _git("show", f"{ref}:infer_core/runner/sampling_inputs.py")
    sampler = sys.modules["old_sampler"] = types.ModuleType("old_sampler")
    exec(compile(sampler_source, "old_sampler.py", "exec"), sampler.__dict__)
    source = source.replace("from infer_core.layers.sampler import", "from old_sampler import")
    inputs = sys.modules["old_sampling_inputs"] = types.ModuleType("old_sampling_inputs")
    exec(compile(source, "old_sampling_inputs.py", "exec"), inputs.__dict__)
    return sampler, inputs


def make_states(num_rows: int, params: dict, rng: np.random.Generator) -> list[RequestState]:
    states = []
    for i in range(num_rows):
        tokens = rng.integers(0, VOCAB, PROMPT_LEN + OUTPUT_LEN).tolist()
        p = dict(params, seed=params["seed"] + i) if "seed" in params else params
        states.append(RequestState(f"r{i}", tokens, PROMPT_LEN, SamplingParams(**p), [], len(tokens)))
    return states


def time_case(sampler, inputs, states, logits, generator, iters: int) -> dict[str, float]:
    device = logits.device

    def build():
        return inputs.build_sampling_batch(states, VOCAB, (), device, generator)

    batch = build()
    for _ in range(3):
        sampler.sample(logits, batch).token_ids.cpu()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        sampler.sample(logits, batch)
    end.record()
    torch.cuda.synchronize()
    sample_us = start.elapsed_time(end) / iters * 1e3
    t0 = time.perf_counter()
    for _ in range(iters):
        build()
    torch.cuda.synchronize()
    build_us = (time.perf_counter() - t0) / iters * 1e6
    t0 = time.perf_counter()
    for _ in range(iters):
        sampler.sample(logits, build()).token_ids.cpu()
    step_us = (time.perf_counter() - t0) / iters * 1e6
    return dict(sample_us=round(sample_us, 1), build_us=round(build_us, 1), step_us=round(step_us, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--old-ref", default=None, help="git ref of the previous sampler")
    parser.add_argument("--old-dir", type=Path, default=None,
                        help="folder with the previous sampler.py and sampling_inputs.py (a checkout without history)")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.sampling needs a CUDA device")
    old_ref = args.old_ref or (str(args.old_dir) if args.old_dir else default_old_ref())
    old_sampler, old_inputs = load_old(old_ref, args.old_dir)
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    results = []
    for num_rows in ROWS:
        logits = torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(num_rows)).mul_(3).to(device)
        for case, params in CASES.items():
            states = make_states(num_rows, params, rng)
            for system, sampler, inputs in (("old", old_sampler, old_inputs), ("new", new_sampler, new_inputs)):
                generator = torch.Generator(device=device).manual_seed(0)
                figures = time_case(sampler, inputs, states, logits, generator, args.iters)
                results.append(dict(system=system, case=case, num_rows=num_rows, vocab_size=VOCAB, **figures))
                print(f"{case:>20} R={num_rows:<4} {system}: {figures}", flush=True)
    settings = dict(vocab_size=VOCAB, rows=list(ROWS), iters=args.iters, old_ref=old_ref,
                    prompt_len=PROMPT_LEN, output_len=OUTPUT_LEN, cases=CASES)
    path = write_result("sampling", settings, results, args.out)
    table = ["| case | rows | old sample µs | new sample µs | speed-up | old step µs | new step µs |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for old, new in zip(results[::2], results[1::2]):
        table.append(f"| {old['case']} | {old['num_rows']} | {old['sample_us']} | {new['sample_us']} | "
                     f"{old['sample_us'] / new['sample_us']:.1f}x | {old['step_us']} | {new['step_us']} |")
    text = "\n".join(table) + "\n"
    path.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
