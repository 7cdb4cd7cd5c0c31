"""The split-K GEMM compiled for an H100 (sm_90) on any machine, with the ptxas that ships in Triton's wheel.

The interpreter runs a kernel's Python, not Triton's compiler: this checks what only the compiler
shows. At the tiles ``choose_config`` picks for the real Qwen3-0.6B / Qwen3-8B shapes and row
counts, the dot must become wgmma (Hopper's tensor-core instruction; otherwise the kernel is no
faster than cuBLAS's), the K loop must be software-pipelined (asynchronous copies into shared
memory), the operand stages must fit an SM's shared memory, and nothing may spill (the merge after
the K loop must not cost the loop registers). The compile runs in a subprocess without
``TRITON_INTERPRET`` (this file is also that script; ``python tests/fused/test_gemm_splitk_sm90.py``
prints the figures).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072),
          (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 1024), (151936, 4096)]
ROWS = (3, 4, 8, 16, 32, 64, 128, 192, 256)
SMEM_PER_BLOCK = 227 << 10  # an H100's largest shared memory per program


def resource_usage(cubin: bytes) -> dict[str, int]:
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text)}


def compile_configs() -> list[dict]:
    """Call ``gemm_splitk`` on CPU tensors with a driver that only names an sm_90 target: every launch
    compiles (warm-up) instead of running."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from infer_core.layers.fused import gemm_splitk as module

    class Sm90Target:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    driver.set_active(Sm90Target())
    module.use_pdl = lambda x: True  # as on an H100
    compiled = []
    kernel, run = module._gemm_splitk_kernel, module._gemm_splitk_kernel.run
    kernel.run = lambda *args, grid, warmup, **kwargs: compiled.append(run(*args, grid=grid, warmup=True, **kwargs))
    results, seen = [], set()
    for n, k in SHAPES:
        w = torch.empty(n, k, dtype=torch.bfloat16)  # never touched: no memory
        for m in ROWS:
            cfg = module.choose_config(m, n, k, 2, 132)
            if (cfg, k % cfg.block_k) in seen:
                continue
            seen.add((cfg, k % cfg.block_k))
            compiled.clear()
            module.gemm_splitk(torch.empty(m, k, dtype=torch.bfloat16), w, None, config=cfg)
            (done,) = compiled
            ttgir = done.asm["ttgir"]
            results.append({"shape": [m, n, k], "config": repr(cfg), "shared": done.metadata.shared,
                            "wgmma": "ttng.warp_group_dot " in ttgir, "async_copies": "ttg.async_copy" in ttgir,
                            **resource_usage(done.asm["cubin"])})
    return results


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default: set to quiet its warning
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, f"compiling for sm_90 failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_chosen_tiles_compile_to_pipelined_wgmma_without_spills(compiled):
    assert len(compiled) >= 4
    for c in compiled:
        assert c["wgmma"], f"{c['shape']} {c['config']}: the dot is not wgmma"
        assert c["async_copies"], f"{c['shape']} {c['config']}: the K loop is not pipelined"
        assert c["shared"] <= SMEM_PER_BLOCK, f"{c['shape']} {c['config']}: {c['shared']} bytes of shared memory"
        assert c["LOCAL"] == 0 and c["STACK"] == 0, f"{c['shape']} {c['config']} spills registers: {c}"


if __name__ == "__main__":
    print(json.dumps(compile_configs()))
