"""Decode-sized ``y = x @ dequant(Wq)^T (+ bias)``: a GEMV that reads int8 / FP8 weights and dequantizes them in
registers.

At 1-8 rows a projection is a read of W and nothing else, so reading one byte a weight instead of two is the
decode speed-up. The activations stay in the model dtype (no per-call quantization launches, and no
activation rounding): the sums are ``sum_k x[m, k] * q[n, k] * scale[n, k // group_k]`` in float32, and the
output is rounded once to x's dtype after the bias. Per-channel weights (one scale a row) multiply the
column sums by the row's scale once at the end; grouped weights (a checkpoint's 128x128 blocks) multiply each
K tile's sums by its group's scale, the tile never wider than a group.

Like the core's dense GEMV (``infer_core.layers.fused.gemv``): each program owns ``BLOCK_N`` rows of W and
walks the whole of K (no split-K, no atomics: the same bits every run and in CUDA-graph replay); rows of x
past ``num_rows`` repeat the last row and are not stored; the tiles come from (N, K) alone, by the core's
``choose_config`` at two bytes a weight (the same values a thread as the dense GEMV holds; at large K the
same bytes: :func:`tiles`); launched with programmatic dependent launch where the dense GEMV is
(``fused.use_pdl``), so it is scheduled while the kernel before it drains. Imports triton: imported only
where a layer was built for it.

With ``silu`` (gate_up's ``[gate; up]`` weights, followed by SiLU-and-mul) a program owns ``BLOCK_N`` columns of
the activation: it loads a gate tile and the matching up tile each K step (half the K step, so the same bytes)
and stores ``silu(gate) * up`` with ``fused/silu_and_mul.py``'s arithmetic on gate and up rounded as this GEMV
stores them: the two launches' values up to the order of the float32 sums (the K step), one launch fewer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv_tiles import LARGE_K, choose_config, num_sms
from infer_core.layers.fused.pdl import pdl_enter

MAX_ROWS = 8  # decode batches; more rows are a GEMM


@triton.jit
def _int8_to_float(w):
    """int8 -> float32 exactly with integer ops and one subtraction, not the conversion instruction (a fraction of
    the FMA rate on NVIDIA GPUs, and a GEMV does one FMA a weight): ``v + 128`` in [0, 255] placed in the mantissa
    of 2**23 is the float ``2**23 + 128 + v``."""
    bits = w.to(tl.int32) + 0x4B000080
    return bits.to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _load_weights(w_ptrs, k, K, EVEN_K: tl.constexpr, W_INT8: tl.constexpr):
    """A ``[BLOCK_N, BLOCK_K]`` tile of the 8-bit weights as float32 (the K tail masked to zero)."""
    if EVEN_K:
        w = tl.load(w_ptrs)
    else:  # masked lanes zeroed after the conversion (an 8-bit float has no literal zero to load as ``other``)
        w = tl.load(w_ptrs, mask=(k < K)[None, :])
    w = _int8_to_float(w) if W_INT8 else w.to(tl.float32)
    if not EVEN_K:
        w = tl.where((k < K)[None, :], w, 0.0)
    return w


@triton.jit
def _row_sums(w, x_row, k, K, m, offs_m, acc, EVEN_K: tl.constexpr):
    """``acc`` with row ``m``'s sums over this K tile added: ``sum_k w[n, k] * x[m, k]``."""
    if EVEN_K:
        xm = tl.load(x_row + k).to(tl.float32)
    else:
        xm = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)
    return tl.where(offs_m[:, None] == m, acc + tl.sum(w * xm[None, :], axis=1)[None, :], acc)


@triton.jit(do_not_specialize=["num_rows"])
def _w8_gemv_kernel(x_ptr, w_ptr, s_ptr, bias_ptr, y_ptr, num_rows, N, K, stride_xm, stride_wn, stride_sn,
                    stride_ym, GROUP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, W_INT8: tl.constexpr,
                    SILU: tl.constexpr, USE_PDL: tl.constexpr):
    """``y[M, N]``: ``x @ dequant(W)^T (+ bias)``, or with ``SILU`` ``silu(gate) * up`` of it (W has 2N rows: the
    gate rows, then the up rows)."""
    pdl_enter(USE_PDL)  # before any load or store (fused/pdl.py): launched early, waits for the kernel before
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = tl.minimum(cols, N - 1).to(tl.int64)  # past N: row N-1 again, never stored
    up_rows = w_rows + N  # SILU only
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # SILU only
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        w = _load_weights(w_ptr + w_rows[:, None] * stride_wn + k[None, :], k, K, EVEN_K, W_INT8)
        if SILU:
            w_up = _load_weights(w_ptr + up_rows[:, None] * stride_wn + k[None, :], k, K, EVEN_K, W_INT8)
        tile = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        tile_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for m in tl.static_range(BLOCK_M):
            x_row = x_ptr + tl.minimum(m, num_rows - 1) * stride_xm
            tile = _row_sums(w, x_row, k, K, m, offs_m, tile, EVEN_K)
            if SILU:
                tile_up = _row_sums(w_up, x_row, k, K, m, offs_m, tile_up, EVEN_K)
        if GROUP_K > 0:  # the tile lies in one group (BLOCK_K divides GROUP_K): one scale a row
            tile = tile * tl.load(s_ptr + w_rows * stride_sn + k0 // GROUP_K)[None, :]
            if SILU:
                tile_up = tile_up * tl.load(s_ptr + up_rows * stride_sn + k0 // GROUP_K)[None, :]
        acc += tile
        acc_up += tile_up
    if GROUP_K == 0:
        acc = acc * tl.load(s_ptr + w_rows * stride_sn)[None, :]
        if SILU:
            acc_up = acc_up * tl.load(s_ptr + up_rows * stride_sn)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if SILU:
            acc_up += tl.load(bias_ptr + N + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    dtype = y_ptr.dtype.element_ty
    if SILU:  # silu_and_mul.py's arithmetic on gate and up as the plain GEMV stores them
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        acc = silu * acc_up.to(dtype).to(tl.float32)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(dtype), mask=(offs_m[:, None] < num_rows) & (cols[None, :] < N))


def tiles(n: int, k: int, group_k: int | None, device: torch.device, silu: bool = False) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) for W [n, k]: the dense GEMV's tiles at two bytes a weight, K tiles no wider
    than a scale group; with ``silu`` (a program loads a gate and an up tile) half the K step, down to 16. From
    ``LARGE_K`` on, where the dense tiles are a fixed count of elements (8 columns by 1024 bf16: 16 KiB a K
    step), twice as many K columns, so a step loads the dense GEMV's 16 KiB of W and each thread holds the
    dense GEMV's bytes in flight (W bytes in flight per SM is what a decode GEMV's speed follows:
    ``infer_core.layers.fused.gemv_tiles``)."""
    cfg = choose_config(n, k, 2, num_sms(device))
    block_k = cfg.block_k
    if k >= LARGE_K and block_k < k:
        block_k = min(2 * block_k, triton.next_power_of_2(k))
        while block_k > 256 and k % block_k:
            block_k //= 2
    if group_k is not None:
        if group_k & (group_k - 1):
            raise ValueError(f"weight scale groups of {group_k} columns: the GEMV takes groups of a power of two")
        block_k = min(block_k, group_k)
    if silu and block_k > 16:  # never wider than before: a K step stays within its scale group
        block_k //= 2
    return cfg.block_n, block_k, cfg.num_warps


def w8_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
            group_k: int | None = None, silu: bool = False) -> torch.Tensor:
    """``x @ (weight * scale)^T + bias`` for at most ``MAX_ROWS`` rows of x [..., K]; a new tensor [..., N]. With
    ``silu``: ``silu(gate) * up`` of it, [..., N / 2] (weight's first N / 2 rows the gate's, the rest the up's).

    ``weight`` [N, K] int8 or float8 e4m3fn, K contiguous; ``scale`` float32 [N, 1] (per channel, ``group_k``
    None) or [N, ceil(K / group_k)] (groups of ``group_k`` columns, a power of two).
    """
    k = x.shape[-1]
    n = weight.shape[0]
    if weight.shape != (n, k) or weight.stride(1) != 1:
        raise ValueError(f"weight {tuple(weight.shape)} must be [N, {k}] with contiguous rows for x {tuple(x.shape)}")
    if scale.dim() != 2 or scale.shape[0] != n or scale.dtype != torch.float32:
        raise ValueError(f"scale {tuple(scale.shape)} {scale.dtype} must be float32 [{n}, groups]")
    if silu and n % 2:
        raise ValueError(f"SiLU-and-mul needs [gate; up] weights of an even row count, got {n} rows: pass the "
                         "gate_up layer's weight (2 x intermediate rows), or silu=False")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    num_rows = rows.shape[0]
    if num_rows > MAX_ROWS:
        raise ValueError(f"w8_gemv takes at most {MAX_ROWS} rows, got {num_rows}: use the W8A8 GEMM")
    n_out = n // 2 if silu else n
    out = torch.empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    if num_rows == 0 or n == 0:
        return out
    groups = 1 if group_k is None else -(-k // group_k)
    if scale.shape[1] != groups:
        raise ValueError(f"scale {tuple(scale.shape)} must have {groups} columns for K={k} in groups of {group_k}")
    block_n, block_k, warps = tiles(n, k, group_k, x.device, silu)
    pdl = use_pdl(rows)
    _w8_gemv_kernel[(triton.cdiv(n_out, block_n),)](
        rows, weight, scale, bias if bias is not None else scale, out, num_rows, n_out, k, rows.stride(0),
        weight.stride(0), scale.stride(0), n_out, GROUP_K=group_k or 0, BLOCK_M=triton.next_power_of_2(num_rows),
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0, HAS_BIAS=bias is not None,
        W_INT8=weight.dtype == torch.int8, SILU=silu, USE_PDL=pdl, num_warps=warps, launch_pdl=pdl,
    )
    return out
