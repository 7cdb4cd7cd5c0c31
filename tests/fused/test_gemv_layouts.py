"""The fused norm + GEMV kernel sums in the same thread layouts as the separate kernels, compiled for an H100.

A float32 sum's bits depend on how the compiler spreads the summed tile over threads (each thread adds
its own values in order, then lanes and warps combine theirs), so the fused kernel is bit-identical
to rms_norm + gemv (+ silu_and_mul) only if each of its sums (a row's sum of squares, a column's
products over a K tile) has the layout the separate kernel gives it. The interpreter cannot show
this (it sums with numpy); here the kernels are compiled for sm_90 without a GPU (Triton's own
ptxas) at the real Qwen3-0.6B / Qwen3-8B shapes, and every ``tt.reduce`` operand's layout compared.

The same compiles check the L2 prefetch that programs of several K steps issue before the PDL wait
(``gemv.prefetch_w_to_l2``): which products become FMAs is the compiler's choice, made on the code
around them, so the kernel with the prefetch must compile to the float instructions of the kernel
without it (``PREFETCH_LINES=0``: the code before the prefetch existed), one for one.
The compiling runs in a child process (this file as a script): the test process runs the interpreter.
"""

from __future__ import annotations

import re

import pytest
import torch

from infer_core.testing_sm90 import compile_for_sm90, compiled_in_a_process, float_ops, print_compiled

triton = pytest.importorskip("triton")

SMS = 132  # an H100
MODELS = {"qwen3-0.6b": (1024, 4096, 6144), "qwen3-8b": (4096, 6144, 24576)}  # hidden, qkv rows, gate_up rows


def prefetch_summary(ptx: str) -> dict:
    """The L2 prefetches and where they stand: before the PDL wait, as they must (W only: no kernel writes it)."""
    lines = [line.strip() for line in ptx.splitlines()]
    wait = next(i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait"))
    prefetches = [i for i, line in enumerate(lines) if line.startswith("prefetch.global.L2")]
    return dict(num_prefetches=len(prefetches), all_before_wait=all(i < wait for i in prefetches),
                float_ops=float_ops(ptx))


def reduce_layouts(ttgir: str) -> list[str]:
    """Every tt.reduce operand's type, its layout alias spelled out."""
    aliases = dict(re.findall(r"^(#\w+) = (#ttg\.[^\n]+)$", ttgir, flags=re.M))
    found = []
    for operand in re.findall(r"\}\) : \((tensor<[^)]*>)\) ->", ttgir):
        found.append(re.sub(r"#\w+", lambda m: aliases.get(m.group(0), m.group(0)), operand))
    return found


def tiles_of(layouts: list[str], rows: int, cols: int) -> list[str]:
    return [t for t in layouts if t.startswith(f"tensor<{rows}x{cols}xf32")]


def rms_norm_layouts(k: int, num_rows: int) -> list[str]:
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS, _rms_norm_kernel
    from infer_core.layers.fused.rms_norm import _tiles as norm_tiles

    bm, bn, _, warps = norm_tiles(k, MAX_SINGLE_PASS)
    t = torch.empty(1, dtype=torch.bfloat16)
    args = dict(x_ptr=t, res_ptr=t, w_ptr=t, out_ptr=t, res_out_ptr=t, num_rows=num_rows, inner_rows=1, n_cols=k,
                stride_x_outer=k, stride_x_inner=0, stride_x_col=1, stride_r_outer=k, stride_r_inner=0,
                stride_r_col=1, eps=1e-6)
    return reduce_layouts(compile_for_sm90(_rms_norm_kernel, args, dict(
        HAS_RESIDUAL=True, SINGLE_PASS=True, BLOCK_M=bm, BLOCK_N=bn, USE_PDL=True), warps, 3)["ttgir"])


def h100_prefetch(cfg, k: int) -> int:
    """PREFETCH_LINES as the launchers pass it on an H100 (PDL on, bf16)."""
    from infer_core.layers.fused.gemv import prefetch_lines

    return prefetch_lines(cfg, k, 2, True)


def gemv_asm(n: int, k: int, num_rows: int, cfg, prefetch: int, *, bias: bool = True) -> dict:
    """The GEMV's code."""
    from infer_core.layers.fused.gemv import _gemv_kernel

    t = torch.empty(1, dtype=torch.bfloat16)
    args = dict(x_ptr=t, w_ptr=t, bias_ptr=t, y_ptr=t, num_rows=num_rows, N=n, K=k, stride_xm=k, stride_wn=k,
                stride_ym=n)
    return compile_for_sm90(_gemv_kernel, args, dict(
        BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
        PREFETCH_LINES=prefetch, USE_PDL=True), cfg.num_warps, cfg.num_stages)


def gemv_layouts(n: int, k: int, num_rows: int, cfg) -> list[str]:
    return reduce_layouts(gemv_asm(n, k, num_rows, cfg, h100_prefetch(cfg, k))["ttgir"])


def fused_asm(n: int, k: int, num_rows: int, cfg, prefetch: int, *, norm: bool, silu: bool,
              store_normed: bool = False) -> dict:
    """The fused kernel's code (``store_normed``: it also stores the normed rows, as an MoE router does)."""
    from infer_core.layers.fused.norm_gemv import _norm_gemv_kernel
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS
    from infer_core.layers.fused.rms_norm import _tiles as norm_tiles

    t = torch.empty(1, dtype=torch.bfloat16)
    n_out = n // 2 if silu else n
    bm, bn, _, _ = norm_tiles(k, MAX_SINGLE_PASS)
    args = dict(x_ptr=t, res_ptr=t, norm_w_ptr=t, w_ptr=t, bias_ptr=t, y_ptr=t, res_out_ptr=t, normed_ptr=t,
                num_rows=num_rows, N=n_out, K=k, stride_xm=k, stride_rm=k, stride_wn=k, stride_ym=n_out, eps=1e-6)
    return compile_for_sm90(_norm_gemv_kernel, args, dict(
        BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=True, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
        HAS_NORM=norm, HAS_RESIDUAL=norm, NORM_BLOCK_M=bm, NORM_BLOCK_N=bn, SILU=silu, STORE_NORMED=store_normed,
        PREFETCH_LINES=prefetch, USE_PDL=True), cfg.num_warps, cfg.num_stages)


def fused_layouts(n: int, k: int, num_rows: int, cfg, *, norm: bool, silu: bool, store_normed: bool = False
                  ) -> list[str]:
    return reduce_layouts(fused_asm(n, k, num_rows, cfg, h100_prefetch(cfg, k), norm=norm, silu=silu,
                                    store_normed=store_normed)["ttgir"])


def prefetch_cases() -> list[dict]:
    """Each kernel of several K steps at 8B-class projections (and a pipelined Qwen3-0.6B one), 1 and 2 rows:
    compiled without the prefetch and with 1 and 2 K steps of it."""
    from dataclasses import replace

    from infer_core.layers.fused.gemv import GemvConfig, choose_config, config_after_rms_norm

    kernels = [(f"gemv {n}x{k}", n, k, choose_config(n, k, 2, SMS), None)
               for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096))]
    kernels.append(("gemv 1024x3072 (3 stages)", 1024, 3072, choose_config(1024, 3072, 2, SMS), None))
    # Qwen3-8B's qkv is one K step now: a 5120-wide model's qkv (several steps) stands in for a norm + GEMV
    kernels += [("norm+qkv 7168x5120", 7168, 5120, config_after_rms_norm(7168, 5120, 2, SMS), False),
                ("norm+gate_up+silu 24576x4096", 24576, 4096, config_after_rms_norm(24576, 4096, 2, SMS, silu=True),
                 True),
                ("gate_up+silu 1024x1000, tail", 1024, 1000, GemvConfig(8, 256, 2, 3), True)]
    cases = []
    for name, n, k, cfg, silu in kernels:
        for num_rows in (1, 2):
            found = {}
            for steps in (0, 1, 2):
                lines = h100_prefetch(replace(cfg, prefetch_steps=steps), k)
                asm = (gemv_asm(n, k, num_rows, cfg, lines) if silu is None else
                       fused_asm(n, k, num_rows, cfg, lines, norm=not name.startswith("gate_up"), silu=silu))
                found[steps] = dict(prefetch_lines=lines, **prefetch_summary(asm["ptx"]))
            cases.append(dict(case=f"{name} rows={num_rows}", block_k=cfg.block_k, k=k, by_steps=found))
    return cases


def collect() -> dict:
    """Every layout the tests compare (run in a process without TRITON_INTERPRET: the kernels must be compiled)."""
    from infer_core.layers.fused.gemv import GemvConfig, config_after_rms_norm
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS
    from infer_core.layers.fused.rms_norm import _tiles as norm_tiles

    cases = []
    for model, (k, n_qkv, n_gate_up) in MODELS.items():
        norm_bm, norm_bn, _, _ = norm_tiles(k, MAX_SINGLE_PASS)
        for num_rows in (1, 2):
            (sum_of_squares,) = rms_norm_layouts(k, num_rows)
            for n, silu in ((n_qkv, False), (n_gate_up, True)):
                cfg = config_after_rms_norm(n, k, 2, SMS, silu=silu)
                fused = fused_layouts(n, k, num_rows, cfg, norm=True, silu=silu)
                cases.append(dict(
                    case=f"{model} {'gate_up+silu' if silu else 'qkv'} rows={num_rows}", silu=silu,
                    block_m=triton.next_power_of_2(num_rows), sum_of_squares=sum_of_squares,
                    column_sums=gemv_layouts(n, k, num_rows, cfg),
                    fused_squares=tiles_of(fused, norm_bm, norm_bn),
                    fused_columns=tiles_of(fused, cfg.block_n, cfg.block_k),
                    unnormed_columns=tiles_of(fused_layouts(n, k, num_rows, cfg, norm=False, silu=silu),
                                              cfg.block_n, cfg.block_k)))
    # an MoE router (Qwen3-30B-A3B's: 128 experts, hidden 2048) also stores the normed rows: the same sums
    k, n = 2048, 128
    norm_bm, norm_bn, _, _ = norm_tiles(k, MAX_SINGLE_PASS)
    cfg = config_after_rms_norm(n, k, 2, SMS)
    for num_rows in (1, 2):
        fused = fused_layouts(n, k, num_rows, cfg, norm=True, silu=False, store_normed=True)
        cases.append(dict(
            case=f"moe router storing the normed rows rows={num_rows}", silu=False,
            block_m=triton.next_power_of_2(num_rows), sum_of_squares=rms_norm_layouts(k, num_rows)[0],
            column_sums=gemv_layouts(n, k, num_rows, cfg), fused_squares=tiles_of(fused, norm_bm, norm_bn),
            fused_columns=tiles_of(fused, cfg.block_n, cfg.block_k),
            unnormed_columns=tiles_of(fused_layouts(n, k, num_rows, cfg, norm=False, silu=False), cfg.block_n,
                                      cfg.block_k)))
    # at the unpinned 4-warp tiles of Qwen3-0.6B's qkv (choose_config's) the fused kernel's sum of squares
    k, n_qkv, _ = MODELS["qwen3-0.6b"]
    norm_bm, norm_bn, _, norm_warps = norm_tiles(k, MAX_SINGLE_PASS)
    four_warps = GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=1)
    four_warp_squares = tiles_of(fused_layouts(n_qkv, k, 1, four_warps, norm=True, silu=False), norm_bm, norm_bn)
    return dict(cases=cases, norm_warps=norm_warps, sum_of_squares=rms_norm_layouts(k, 1)[0],
                four_warp_squares=four_warp_squares, prefetch=prefetch_cases())


@pytest.fixture(scope="module")
def layouts() -> dict:
    return compiled_in_a_process(__file__)


def test_fused_sums_have_the_separate_kernels_layouts(layouts):
    for case in layouts["cases"]:
        column_sums = set(case["column_sums"])
        assert len(column_sums) == 1, case
        assert case["fused_squares"] and set(case["fused_squares"]) == {case["sum_of_squares"]}, case
        assert len(case["fused_columns"]) == (2 if case["silu"] else 1) * case["block_m"], case
        assert set(case["fused_columns"]) == column_sums, case
        assert set(case["unnormed_columns"]) == column_sums, case  # gemv_silu_and_mul


def test_the_warp_count_changes_the_layout(layouts):
    """Why the GEMV after a norm runs at the norm's warps: at Qwen3-0.6B's 4-warp GEMV tiles the sum of
    squares inside the fused kernel would be laid out unlike rms_norm's (2 warps), so its bits could differ."""
    assert layouts["norm_warps"] == 2
    assert layouts["four_warp_squares"] and layouts["sum_of_squares"] not in layouts["four_warp_squares"]


def test_l2_prefetch_stands_before_the_wait_and_changes_no_float_instruction(layouts):
    """Programs of several K steps ask L2 for W before the PDL wait; the sums compile as without it (same bits)."""
    for case in layouts["prefetch"]:
        without = case["by_steps"]["0"]
        assert without["num_prefetches"] == 0 and without["prefetch_lines"] == 0, case["case"]
        for steps in ("1", "2"):
            found = case["by_steps"][steps]
            want_k = min(case["k"], int(steps) * case["block_k"])  # elements of each row asked for
            assert found["prefetch_lines"] * 64 >= want_k, (case["case"], steps)
            assert found["num_prefetches"] >= 1 and found["all_before_wait"], (case["case"], steps)
            assert found["float_ops"] == without["float_ops"], (case["case"], steps)


if __name__ == "__main__":
    print_compiled(collect)
