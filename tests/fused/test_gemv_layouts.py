"""The fused norm + GEMV kernel sums in the same thread layouts as the separate kernels, compiled for an H100.

A float32 sum's bits depend on how the compiler spreads the summed tile over threads (each thread adds
its own values in order, then lanes and warps combine theirs), so the fused kernel is bit-identical
to rms_norm + gemv (+ silu_and_mul) only if each of its sums (a row's sum of squares, a column's
products over a K tile) has the layout the separate kernel gives it. The interpreter cannot show
this (it sums with numpy); here the kernels are compiled for sm_90 without a GPU (Triton's own
ptxas) at the real Qwen3-0.6B / Qwen3-8B shapes, and every ``tt.reduce`` operand's layout compared.
The compiling runs in a child process (this file as a script): the test process runs the interpreter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

SMS = 132  # an H100
MODELS = {"qwen3-0.6b": (1024, 4096, 6144), "qwen3-8b": (4096, 6144, 24576)}  # hidden, qkv rows, gate_up rows


class CannotCompile(Exception):
    pass


def compile_for_sm90(fn, args: dict, constexprs: dict, num_warps: int, num_stages: int) -> str:
    """The TTGIR of ``fn`` specialised as the JIT would for these arguments (16-byte aligned tensors)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, constants, attrs = {}, dict(constexprs), {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(args[name], torch.Tensor):
            signature[name] = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}[args[name].dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(args[name], float):
            signature[name] = "fp32"
        elif name != "num_rows" and args[name] == 1:  # the JIT turns ints equal to 1 into constants
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if name != "num_rows" and args[name] % 16 == 0:  # num_rows: do_not_specialize
                attrs[(i,)] = [["tt.divisibility", 16]]
    try:
        compiled = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": True})
    except Exception as exc:  # no NVIDIA backend or ptxas in this triton install
        raise CannotCompile(f"{type(exc).__name__}: {exc}") from exc
    return compiled.asm["ttgir"]


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
        HAS_RESIDUAL=True, SINGLE_PASS=True, BLOCK_M=bm, BLOCK_N=bn, USE_PDL=True), warps, 3))


def gemv_layouts(n: int, k: int, num_rows: int, cfg) -> list[str]:
    from infer_core.layers.fused.gemv import _gemv_kernel

    t = torch.empty(1, dtype=torch.bfloat16)
    args = dict(x_ptr=t, w_ptr=t, bias_ptr=t, y_ptr=t, num_rows=num_rows, N=n, K=k, stride_xm=k, stride_wn=k,
                stride_ym=n)
    return reduce_layouts(compile_for_sm90(_gemv_kernel, args, dict(
        BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=True, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
        USE_PDL=True), cfg.num_warps, cfg.num_stages))


def fused_layouts(n: int, k: int, num_rows: int, cfg, *, norm: bool, silu: bool) -> list[str]:
    from infer_core.layers.fused.norm_gemv import _norm_gemv_kernel
    from infer_core.layers.fused.rms_norm import MAX_SINGLE_PASS
    from infer_core.layers.fused.rms_norm import _tiles as norm_tiles

    t = torch.empty(1, dtype=torch.bfloat16)
    n_out = n // 2 if silu else n
    bm, bn, _, _ = norm_tiles(k, MAX_SINGLE_PASS)
    args = dict(x_ptr=t, res_ptr=t, norm_w_ptr=t, w_ptr=t, bias_ptr=t, y_ptr=t, res_out_ptr=t, num_rows=num_rows,
                N=n_out, K=k, stride_xm=k, stride_rm=k, stride_wn=k, stride_ym=n_out, eps=1e-6)
    return reduce_layouts(compile_for_sm90(_norm_gemv_kernel, args, dict(
        BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=k % cfg.block_k == 0, HAS_BIAS=True, NUM_STAGES=cfg.num_stages, SINGLE_STEP=cfg.block_k >= k,
        HAS_NORM=norm, HAS_RESIDUAL=norm, NORM_BLOCK_M=bm, NORM_BLOCK_N=bn, SILU=silu, USE_PDL=True),
        cfg.num_warps, cfg.num_stages))


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
                cfg = config_after_rms_norm(n, k, 2, SMS)
                fused = fused_layouts(n, k, num_rows, cfg, norm=True, silu=silu)
                cases.append(dict(
                    case=f"{model} {'gate_up+silu' if silu else 'qkv'} rows={num_rows}", silu=silu,
                    block_m=triton.next_power_of_2(num_rows), sum_of_squares=sum_of_squares,
                    column_sums=gemv_layouts(n, k, num_rows, cfg),
                    fused_squares=tiles_of(fused, norm_bm, norm_bn),
                    fused_columns=tiles_of(fused, cfg.block_n, cfg.block_k),
                    unnormed_columns=tiles_of(fused_layouts(n, k, num_rows, cfg, norm=False, silu=silu),
                                              cfg.block_n, cfg.block_k)))
    # at the unpinned 4-warp tiles of Qwen3-0.6B's qkv (choose_config's) the fused kernel's sum of squares
    k, n_qkv, _ = MODELS["qwen3-0.6b"]
    norm_bm, norm_bn, _, norm_warps = norm_tiles(k, MAX_SINGLE_PASS)
    four_warps = GemvConfig(block_n=8, block_k=1024, num_warps=4, num_stages=1)
    four_warp_squares = tiles_of(fused_layouts(n_qkv, k, 1, four_warps, norm=True, silu=False), norm_bm, norm_bn)
    return dict(cases=cases, norm_warps=norm_warps, sum_of_squares=rms_norm_layouts(k, 1)[0],
                four_warp_squares=four_warp_squares)


@pytest.fixture(scope="module")
def layouts() -> dict:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default: set to quiet its warning
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode == 3:
        pytest.skip(f"cannot compile for sm_90 here: {done.stdout.strip()}")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


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


if __name__ == "__main__":
    try:
        print(json.dumps(collect()))
    except CannotCompile as exc:
        print(exc)
        sys.exit(3)
