"""Sampling on one GPU: the previous sampler ("old") against the current one ("new"), same inputs, same run.

"old" is the sampler, its fused kernel and its batch builder at ``--old-ref`` in git (default
0ebf34c: before the two-pass kernel), or those three files in ``--old-dir`` (for a checkout without
the history: ``git show REF:PATH > DIR/NAME`` them where the history is). Logits are bfloat16 (the model's) at Qwen3's
vocabulary. For each case and batch size:

- ``gpu_us``: device time of one ``sample`` call, CUDA events around ``--iters`` calls queued
  behind a sleeping kernel (so the host's launch time does not show);
- ``host_us``: host time of one ``sample`` call (launching only, no wait);
- ``step_us``: host wall time of build + sample + the copy of the token ids to the host, as the
  runner does each step;
- ``launches``: device operations (kernels, copies, fills) of one ``sample`` call;
- ``same_tokens``: old and new pick the same tokens (greedy and seeded cases; unseeded rows draw
  their keys differently now, so their tokens differ).

Last, "place tokens": the runner's placement of the previous step's tokens into the next step's
input ids (torch's index_select + cast + index_put_, against ``sampler.place_sampled_tokens``).

    python3 -m benchmarks.sampling            # the offline-throughput and batch-1 cases
    python3 -m benchmarks.sampling --all      # and top-k/top-p/min-p/seeded/penalties at 1, 64, 256 rows
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import write_result  # noqa: E402
from infer_core import SamplingParams  # noqa: E402
from infer_core.layers import sampler as new_sampler  # noqa: E402
from infer_core.runner import sampling_inputs  # noqa: E402
from infer_core.runner.state import RequestState  # noqa: E402

VOCAB = 151936
OLD_REF = "0ebf34c"  # the sampler before the two-pass kernel
OLD_FILES = (("fused.py", "infer_core/layers/sampling/fused.py"), ("sampler.py", "infer_core/layers/sampler.py"),
             ("sampling_inputs.py", "infer_core/runner/sampling_inputs.py"))
PROMPT_LEN, OUTPUT_LEN = 128, 256  # token histories for the penalties case
KEY_CASES = [("greedy", 1), ("temperature=0.6", 1), ("greedy", 256), ("temperature=0.6", 256)]
CASES = {
    "greedy": dict(temperature=0.0),
    "temperature=0.6": dict(temperature=0.6),  # offline-throughput
    "top_k=50": dict(temperature=0.7, top_k=50),
    "top_p=0.9": dict(temperature=0.7, top_p=0.9),
    "top_k=50,top_p=0.9": dict(temperature=0.7, top_k=50, top_p=0.9),
    "min_p=0.05": dict(temperature=0.7, min_p=0.05),
    "seeded": dict(temperature=0.7, seed=1234),
    "penalties": dict(temperature=0.7, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5),
}


def _module_from_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_old(ref: str, folder: Path | None) -> tuple[types.ModuleType, types.ModuleType]:
    """The previous sampler, wired to the previous kernel (a file: triton reads its kernels' source), and
    the previous batch builder, wired to that sampler: from ``folder`` when given, else from git at ``ref``."""
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="old_sampler_"))
        for name, path in OLD_FILES:
            shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True)
            if shown.returncode:
                raise SystemExit(f"git show {ref}:{path} failed ({shown.stderr.strip()}); run where the history is, "
                                 f"or write the old {', '.join(n for n, _ in OLD_FILES)} to a folder for --old-dir")
            (folder / name).write_text(shown.stdout)
    old_fused = _module_from_file("old_sampling_fused", folder / "fused.py")
    old = _module_from_file("old_sampler", folder / "sampler.py")
    old._fused_kernels = lambda: old_fused
    source = (folder / "sampling_inputs.py").read_text()
    source = source.replace("from infer_core.layers.sampler import", "from old_sampler import")
    inputs = sys.modules["old_sampling_inputs"] = types.ModuleType("old_sampling_inputs")
    exec(compile(source, str(folder / "sampling_inputs.py"), "exec"), inputs.__dict__)
    return old, inputs


def make_states(num_rows: int, params: dict, rng: np.random.Generator) -> list[RequestState]:
    """Rows share one SamplingParams (as LLM.generate's requests do), but for their seeds."""
    shared = SamplingParams(**params)
    states = []
    for i in range(num_rows):
        tokens = rng.integers(0, VOCAB, PROMPT_LEN + OUTPUT_LEN).tolist()
        p = SamplingParams(**dict(params, seed=params["seed"] + i)) if "seed" in params else shared
        states.append(RequestState(f"r{i}", tokens, PROMPT_LEN, p, [], len(tokens)))
    return states


def gpu_us(fn, iters: int) -> float:
    """Device time per call: the calls are queued while a sleeping kernel holds the stream."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    host_s = (time.perf_counter() - t0) / 3
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int((host_s * iters * 2 + 2e-3) * 2e9))  # outlasts the launches (cycles at <= 2 GHz)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def host_us(fn, iters: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / iters * 1e6


def launches(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def time_case(sampler, inputs, states, logits, iters: int) -> tuple[dict, torch.Tensor]:
    device = logits.device
    generator = torch.Generator(device=device).manual_seed(0)

    def build():
        return inputs.build_sampling_batch(states, VOCAB, (), device, generator)

    batch = build()
    tokens = sampler.sample(logits, batch).token_ids.cpu()

    def call():
        return sampler.sample(logits, batch)

    figures = dict(gpu_us=gpu_us(call, iters), host_us=host_us(call, iters), launches=launches(call))
    t0 = time.perf_counter()
    for _ in range(iters):
        sampler.sample(logits, build()).token_ids.cpu()
    figures["step_us"] = (time.perf_counter() - t0) / iters * 1e6
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}, tokens


def time_placement(iters: int) -> list[dict]:
    """The runner's pending-token placement: torch's index_select + cast + index_put_ against one kernel."""
    results = []
    for num_rows in (1, 256):
        input_ids = torch.zeros(num_rows, dtype=torch.int32, device="cuda")
        sampled = torch.randint(0, VOCAB, (num_rows,), device="cuda")
        dst = torch.arange(num_rows, dtype=torch.int32, device="cuda")
        src = torch.randperm(num_rows, device="cuda").to(torch.int32)
        calls = {"old": lambda: input_ids.index_put_((dst,), sampled.index_select(0, src).to(input_ids.dtype)),
                 "new": lambda: new_sampler.place_sampled_tokens(input_ids, dst, sampled, src)}
        for system, call in calls.items():
            figures = dict(gpu_us=round(gpu_us(call, iters), 1), host_us=round(host_us(call, iters), 1),
                           launches=launches(call), step_us=None)
            results.append(dict(system=system, case="place tokens", num_rows=num_rows, **figures,
                                **({"same_tokens": None} if system == "new" else {})))
            print(f"{'place tokens':>20} R={num_rows:<4} {system} {figures}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--old-ref", default=OLD_REF, help=f"git ref of the previous sampler (default {OLD_REF})")
    parser.add_argument("--old-dir", type=Path, default=None, help="the previous fused.py, sampler.py and "
                        "sampling_inputs.py, for a checkout without the history (instead of --old-ref)")
    parser.add_argument("--all", action="store_true", help="every case at 1, 64 and 256 rows")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--logit-scale", type=float, default=3.0, help="logits ~ N(0, scale^2), then bfloat16")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.sampling needs a CUDA device")
    old_sampler, old_inputs = load_old(args.old_ref, args.old_dir)
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    runs = [(case, rows) for rows in (1, 64, 256) for case in CASES] if args.all else KEY_CASES
    results = []
    for case, num_rows in runs:
        logits = (torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(num_rows)) * args.logit_scale)
        logits = logits.to(device=device, dtype=torch.bfloat16)
        states = make_states(num_rows, CASES[case], rng)
        row = dict(case=case, num_rows=num_rows, vocab_size=VOCAB)
        old, old_tokens = time_case(old_sampler, old_inputs, states, logits, args.iters)
        new, new_tokens = time_case(new_sampler, sampling_inputs, states, logits, args.iters)
        same = bool(torch.equal(old_tokens, new_tokens)) if case in ("greedy", "seeded") else None
        results += [dict(row, system="old", **old), dict(row, system="new", same_tokens=same, **new)]
        print(f"{case:>20} R={num_rows:<4} old {old}  new {new}  same tokens {same}", flush=True)
    results += time_placement(args.iters)
    settings = dict(vocab_size=VOCAB, dtype="bfloat16", iters=args.iters, logit_scale=args.logit_scale,
                    old=str(args.old_dir) if args.old_dir else args.old_ref, cases={c: CASES[c] for c, _ in runs})
    path = write_result("sampling", settings, results, args.out)
    table = ["| case | rows | old GPU µs | new GPU µs | speed-up | old host µs | new host µs | old launches | "
             "new launches | old step µs | new step µs | same tokens |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for old, new in zip(results[::2], results[1::2]):
        table.append(f"| {old['case']} | {old['num_rows']} | {old['gpu_us']} | {new['gpu_us']} | "
                     f"{old['gpu_us'] / new['gpu_us']:.1f}x | {old['host_us']} | {new['host_us']} | "
                     f"{old['launches']} | {new['launches']} | {old['step_us']} | {new['step_us']} | "
                     f"{'-' if new['same_tokens'] is None else new['same_tokens']} |")
    text = "\n".join(table) + "\n"
    path.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
