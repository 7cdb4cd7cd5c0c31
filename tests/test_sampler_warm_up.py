"""The engine compiles the sampler's kernel variants at start-up, not mid-run at each new batch size.

The sampler's launch plan (splits per row, tiles per split) is a compile-time constant and changes
with the number of rows; one temperature for every row and a temperature per row are two more
variants. A first-use compile costs about a second on the H100 machine's host, so the offline
benchmark's prefill steps took 0.8-1.4 s each until the warm-up covered them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")


def test_row_counts_per_plan_give_every_plan_once_at_its_smallest_row_count():
    from infer_core.layers.sampling.fused import _plan, row_counts_per_plan

    vocab_size = 20_000  # 10 tiles: one row splits 4 ways on the interpreter's one "SM"
    counts = row_counts_per_plan(64, vocab_size, torch.device("cpu"))
    plans = [_plan(n, vocab_size, None, None) for n in range(1, 65)]
    assert len(set(plans)) > 1, "the shape must meet several plans for this test to mean anything"
    assert [_plan(n, vocab_size, None, None) for n in counts] == list(dict.fromkeys(plans))
    assert counts == [plans.index(plan) + 1 for plan in dict.fromkeys(plans)]


_NO_COMPILES_SCRIPT = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    from infer_core import LLM, SamplingParams
    from infer_core.bench.compiles import CompileWatch
    from infer_core.testing import make_tiny_checkpoint

    folder = make_tiny_checkpoint("qwen3", Path(tempfile.mkdtemp()) / "m")
    llm = LLM(str(folder), device="cuda", max_num_seqs=40, max_model_len=256)
    watch = CompileWatch()
    watch.start()
    for num_prompts in (1, 3, 9, 17, 33, 40):
        prompts = [[1 + i, 2, 3] for i in range(num_prompts)]
        llm.generate(prompts, [SamplingParams(temperature=0.8, max_tokens=4) for _ in prompts], use_tqdm=False)
        llm.generate(prompts, SamplingParams(temperature=0.8, max_tokens=4), use_tqdm=False)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    sampler = [name for name in watch.compiled() if name in ("sample_kernel", "argmax_kernel")]
    print("compiled in the run:", watch.compiled())
    sys.exit(1 if sampler else 0)
""")


@pytest.mark.gpu
def test_no_sampler_kernel_compiles_after_start_up(tmp_path):
    """In a fresh process with an empty Triton cache: start-up compiles the sampler's variants, so
    generating at batch sizes of every plan (per-request, shared and greedy params) compiles none."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    run = subprocess.run([sys.executable, "-c", _NO_COMPILES_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
