"""The experts' grouped GEMMs and decode GEMVs compiled for an H100 (sm_90) on any machine, for 8-bit weights and
dense ones.

Triton's interpreter runs the kernel's Python, not its compiler, so the CPU tests of ``test_experts.py`` cannot
show that converting an int8 or e4m3 tile to bfloat16 compiles for the GPU. Here ``fused_experts`` is called on
CPU tensors with a driver that only names an sm_90 target: each launch compiles (Triton's own argument
specialization) instead of running, at Qwen3-30B-A3B's expert shapes and a step size for each tile set, and
``moe_gemv_experts`` at one token of top-8 and two of top-2. The
compile runs in a subprocess without ``TRITON_INTERPRET`` (this file is that script); where this Triton has no
NVIDIA backend the test is skipped.
"""

from __future__ import annotations

import pytest
from infer_core.testing_sm90 import CannotCompile, compiled_in_a_process, cubin_resource_usage, print_compiled, target_sm90

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 8, 2
TOKENS = (16, 80, 400, 1200)  # 4, 20, 100 and 300 entries an expert: every tile set of choose_tiles
WEIGHTS = ("bfloat16", "int8", "float8_e4m3fn")


def compile_cases() -> list[dict]:
    import torch

    from infer_core.layers.fused import moe_gemm, moe_gemv
    from infer_core.layers.fused.moe_gemm import choose_tiles, fused_experts
    from infer_core.layers.moe.align import align_by_expert

    try:
        import triton.backends.nvidia  # noqa: F401 - the backend that compiles for sm_90
    except ImportError as exc:
        raise CannotCompile(f"no NVIDIA backend in this Triton ({exc})") from exc
    target_sm90()
    moe_gemm.use_pdl = moe_gemv.use_pdl = lambda x: True  # as on an H100
    moe_gemv.num_sms = lambda device: 132
    compiled = []
    for kernel in (moe_gemm._moe_gemm_kernel, moe_gemm._combine_kernel, moe_gemv._gate_up_kernel,
                   moe_gemv._down_kernel):

        def warm_up(*args, grid, warmup, kernel_run=kernel.run, name=kernel.__name__, **kwargs):
            compiled.append((name, kernel_run(*args, grid=grid, warmup=True, **kwargs)))

        kernel.run = warm_up
    results = []
    for weights in WEIGHTS:
        dtype = getattr(torch, weights)
        gate_up = torch.zeros(EXPERTS, 2 * INTER, HIDDEN).to(dtype)
        down = torch.zeros(EXPERTS, HIDDEN, INTER).to(dtype)
        scales = {} if weights == "bfloat16" else dict(gate_up_scale=torch.ones(EXPERTS, 2 * INTER),
                                                      down_scale=torch.ones(EXPERTS, HIDDEN))
        for num_tokens in TOKENS:
            ids = (torch.arange(num_tokens * TOP_K) % EXPERTS).view(num_tokens, TOP_K)
            tiles = choose_tiles(ids.numel(), EXPERTS)
            compiled.clear()
            fused_experts(torch.zeros(num_tokens, HIDDEN, dtype=torch.bfloat16), gate_up, down,
                          torch.full((num_tokens, TOP_K), 0.5), align_by_expert(ids, EXPERTS, tiles.block_m), tiles,
                          **scales)
            for name, kernel in compiled:
                results.append({"weights": weights, "tokens": num_tokens, "block_m": tiles.block_m, "kernel": name,
                                "dynamic_shared": kernel.metadata.shared, **cubin_resource_usage(kernel.asm["cubin"])})
        for num_tokens, top_k in ((1, 8), (2, 2)):
            ids = (torch.arange(num_tokens * top_k) % EXPERTS).view(num_tokens, top_k)
            compiled.clear()
            moe_gemv.moe_gemv_experts(torch.zeros(num_tokens, HIDDEN, dtype=torch.bfloat16), gate_up, down,
                                      torch.full((num_tokens, top_k), 0.5), ids, **scales)
            for name, kernel in compiled:
                results.append({"weights": weights, "tokens": num_tokens, "kernel": name,
                                "dynamic_shared": kernel.metadata.shared,
                                **cubin_resource_usage(kernel.asm["cubin"])})
    return results


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    return compiled_in_a_process(__file__)


def test_every_tile_set_and_the_gemvs_compile_for_sm90_with_8_bit_and_dense_weights(compiled):
    gemms = [c for c in compiled if c["kernel"] == "_moe_gemm_kernel"]
    assert {(c["weights"], c["tokens"]) for c in gemms} == {(w, t) for w in WEIGHTS for t in TOKENS}
    assert len(gemms) == 2 * len(WEIGHTS) * len(TOKENS)  # gate_up and down each
    assert {c["block_m"] for c in gemms} == {16, 32, 64}
    gemvs = [c for c in compiled if c["kernel"] in ("_gate_up_kernel", "_down_kernel")]
    assert len(gemvs) == 2 * 2 * len(WEIGHTS)  # both launches, two step sizes
    for case in gemms + gemvs:  # H100's 227 KiB of shared memory a block, and nothing spilled to local memory
        assert case["dynamic_shared"] + case["SHARED"] <= 227 * 1024 and case["LOCAL"] == 0, case


if __name__ == "__main__":
    print_compiled(compile_cases)
