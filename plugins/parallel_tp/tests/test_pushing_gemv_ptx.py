"""The pushing GEMV sums as the core's plain GEMV does, compiled for an H100 (sm_90, no GPU: Triton's own ptxas).

Partial sums pushed to every rank must be the bits the plain GEMV would hand NCCL, so the pushed path
all-reduces what NCCL would. Both kernels take their tile from the core's ``gemv_tile``; here their float
instructions are compared at Qwen3-8B's row-parallel shapes on two ranks: pushing adds no arithmetic (only
shuffles that bring two rounded values into one word, after the last rounding), and in mode ``gemv`` the
adding programs' code comes after the GEMV's. The compiling runs in a child process (this file as a script):
the test process may run Triton's interpreter.
"""

from __future__ import annotations


import pytest
import torch
from infer_core.testing_sm90 import compile_for_sm90, compiled_in_a_process, float_ops, print_compiled

triton = pytest.importorskip("triton")

SMS = 132  # an H100


def ptx_cases() -> list[dict]:
    """Qwen3-8B at two ranks: o_proj and down_proj plain, pushing, and pushing with the adding programs."""
    from infer_core.layers.fused.gemv import _gemv_kernel, choose_config, prefetch_lines

    from infer_parallel_tp.pushed_sums import ADD_BLOCK
    from infer_parallel_tp.pushing_gemv import _pushing_gemv_kernel

    t = torch.empty(1, dtype=torch.bfloat16)
    words = torch.empty(1, dtype=torch.int64)  # this rank's slot of 64-bit words; the slots' addresses
    abort = torch.empty(1, dtype=torch.int32)
    cases = []
    for num_rows in (1, 2):
        for name, n, k in (("o_proj", 4096, 4096 // 2), ("down_proj", 4096, 12288 // 2)):
            cfg = choose_config(n, k, 2, SMS)
            tiles = dict(BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                         EVEN_K=k % cfg.block_k == 0, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
                         PREFETCH_LINES=prefetch_lines(cfg, k, 2, True), USE_PDL=True)
            shape = dict(x_ptr=t, w_ptr=t, bias_ptr=t, num_rows=num_rows, N=n, K=k, stride_xm=k, stride_wn=k,
                         stride_ym=n)
            plain = compile_for_sm90(_gemv_kernel, dict(shape, y_ptr=t), dict(tiles, HAS_BIAS=False), cfg.num_warps,
                                     cfg.num_stages)
            pushing = {}
            for mode, add_programs in (("sum", 0), ("gemv", num_rows * n // ADD_BLOCK)):
                args = dict(shape, own_slot_ptr=words, dest_ptrs=words, slots_ptr=words, slot_words=8 * n // 2,
                            sum_ptr=t, abort_ptr=abort)
                push = dict(PUSH_RANKS=2, PUSH_VALUES_PER_WORD=2, ADD_PROGRAMS=add_programs, ADD_BLOCK=ADD_BLOCK)
                pushing[mode] = float_ops(compile_for_sm90(_pushing_gemv_kernel, args, dict(tiles, **push),
                                                           cfg.num_warps, cfg.num_stages)["ptx"])
            cases.append(dict(case=f"{name} rows={num_rows}", plain=float_ops(plain["ptx"]), pushed=pushing["sum"],
                              adding=pushing["gemv"]))
    return cases


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return compiled_in_a_process(__file__)


def test_pushing_changes_no_float_instruction(cases):
    for case in cases:
        pushed = case["pushed"]
        moves = [i for i, op in enumerate(pushed) if op.startswith("shfl.sync.idx")]
        last_rounding = max(i for i, op in enumerate(pushed) if op.startswith("cvt.rn.bf16.f32"))
        assert all(i > last_rounding for i in moves), case["case"]
        arithmetic = [op for i, op in enumerate(pushed) if i not in moves]
        assert case["plain"] and arithmetic == case["plain"], case["case"]
        # the last programs adding the ranks' words (mode gemv) come after: the GEMV's own code is unchanged
        assert case["adding"][:len(pushed)] == pushed, case["case"]


if __name__ == "__main__":
    print_compiled(ptx_cases)
