"""The decode kernels compiled for an H100 (sm_90) on any machine, with the ptxas that ships in Triton's wheel.

The interpreter runs a kernel's Python, not Triton's compiler: a kernel can pass every CPU test
and still fail to compile (a loop-carried value whose shape changes does). And the merge at the
end of the split-K decode kernel must not cost its attention loop occupancy: no spills, and few
enough registers that the programs of a split launch (about 2-4 per SM) stay resident together.

The compile runs in a subprocess without ``TRITON_INTERPRET`` (this file is also that script): the
launches of ``decode_attention`` are compiled for sm_90 with Triton's own argument specialization,
and not run. ``python plugins/attention_triton/tests/test_decode_sm90_compile.py`` prints the
resource usage.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
from infer_core.testing_sm90 import cubin_resource_usage, target_sm90

# (query heads, KV heads, head_dim, split count, one-launch merge): the shapes of Qwen3-0.6B and
# Qwen3-8B at the split counts of batch 1, the widest group the backend takes, and head_dim 256.
CONFIGS = [
    (16, 8, 128, 32, True),
    (16, 8, 128, 32, False),
    (32, 8, 128, 64, True),
    (32, 2, 128, 64, True),
    (8, 4, 256, 64, True),
]
CACHE_DTYPES = ("bfloat16", "float8_e4m3fn")  # the model's dtype, and an FP8 cache (float16 dots)
MAX_REGISTERS = 128  # 4 programs of 4 warps per SM: twice what a split launch aims at
# An FP8 cache's 128-key tiles take about 200 (2 programs per SM) and were measured faster than 64-key ones at
# about 145 (benchmarks/kv_fp8_decode_sweep.py): the bound there only keeps them off the 255 where spills begin.
MAX_REGISTERS_FP8 = 224


def compile_configs() -> list[dict]:
    """Call ``decode_attention`` on CPU tensors with a driver that only names an sm_90 target: every
    launch compiles (warm-up) instead of running."""
    import torch
    import triton

    from infer_attention_triton import decode
    from infer_attention_triton.tiles import decode_tiles

    target_sm90()
    decode.use_pdl = lambda x: True  # as on an H100
    compiled: list[tuple[str, triton.compiler.CompiledKernel]] = []
    for kernel in (decode._decode_kernel, decode._merge_splits_kernel):

        def warm_up(*args, grid, warmup, kernel_run=kernel.run, name=kernel.__name__, **kwargs):
            compiled.append((name, kernel_run(*args, grid=grid, warmup=True, **kwargs)))

        kernel.run = warm_up
    results = []
    for (num_heads, num_kv_heads, head_dim, num_splits, merge_in_kernel), cache_dtype in itertools.product(
            CONFIGS, CACHE_DTYPES):
        num_seqs, page, num_blocks = 1, 16, 64
        q = torch.zeros(num_seqs, num_heads, head_dim, dtype=torch.bfloat16)
        cache = torch.zeros(2, num_blocks, page, num_kv_heads, head_dim, dtype=torch.bfloat16).to(getattr(torch, cache_dtype))
        tables = torch.zeros(num_seqs, num_blocks, dtype=torch.int32)
        seq_lens = torch.full((num_seqs,), 100, dtype=torch.int32)
        scratch = decode.SplitScratch.allocate(num_seqs, num_heads, num_splits, head_dim, "cpu")
        compiled.clear()
        decode.decode_attention(
            q, cache, tables, seq_lens, torch.zeros_like(q), scale=head_dim**-0.5, num_splits=num_splits,
            tiles=decode_tiles(head_dim, kv_fp8=cache_dtype == "float8_e4m3fn"), scratch=scratch,
            merge_in_kernel=merge_in_kernel,
            req_order=torch.zeros(num_seqs, dtype=torch.int32),  # as the backend launches it
        )  # fmt: skip
        for name, kernel in compiled:
            results.append(
                {
                    "config": [num_heads, num_kv_heads, head_dim, num_splits, merge_in_kernel],
                    "cache": cache_dtype,
                    "kernel": name,
                    **cubin_resource_usage(kernel.asm["cubin"]),
                }
            )
    return results


@pytest.fixture(scope="module")
def usage() -> list[dict]:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"compiling for sm_90 failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_decode_kernels_compile_for_sm90_without_spills(usage):
    kernels = {(tuple(u["config"]), u["cache"], u["kernel"]) for u in usage}
    for config, cache in itertools.product(CONFIGS, CACHE_DTYPES):
        assert (config, cache, "_decode_kernel") in kernels
        assert ((config, cache, "_merge_splits_kernel") in kernels) == (not config[-1]), "two launches only without merge"
    for u in usage:
        assert u["LOCAL"] == 0 and u["STACK"] == 0, f"{u['kernel']} {u['config']} spills registers: {u}"
        if u["kernel"] == "_decode_kernel":
            bound = MAX_REGISTERS_FP8 if u["cache"] == "float8_e4m3fn" else MAX_REGISTERS
            assert u["REG"] <= bound, f"{u['config']}: {u['REG']} registers cost occupancy: {u}"


if __name__ == "__main__":
    print(json.dumps(compile_configs()))
