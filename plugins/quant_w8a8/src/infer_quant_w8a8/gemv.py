"""Decode-sized ``y = x @ dequant(Wq)^T (+ bias)``: a GEMV that reads int8 / FP8 weights and dequantizes them in
registers.

At 1-8 rows a projection is a read of W and nothing else, so reading one byte a weight instead of two is the
decode speed-up. The activations stay in the model dtype (no per-call quantization launches, and no
activation rounding): float32 sums of ``x * q * scale``, rounded once to x's dtype after the bias.

Like the core's dense GEMV (``infer_core.layers.fused.gemv``): a program owns ``BLOCK_N`` rows of W and walks
the whole of K (the kernel: ``gemv_kernel.py``); the tiles come from (N, K) alone, by the core's
``choose_config`` at two bytes a weight (the same values a thread as the dense GEMV holds; at large K the same
bytes: :func:`tiles`); launched with programmatic dependent launch where the dense GEMV is (``fused.use_pdl``),
so it is scheduled while the kernel before it drains. Imports triton: imported only where a layer was built
for it.

With ``silu`` (gate_up's ``[gate; up]`` weights, followed by SiLU-and-mul) a program loads a gate tile and the
matching up tile each K step (half the K step, so the same bytes) and stores ``silu(gate) * up``: the two
launches' values up to the order of the float32 sums (the K step), one launch fewer.

``w8_rms_norm_gemv`` also computes the RMSNorm (+ residual add) before it, as the layer's input norm
(``LinearMethod.apply_with_norm``): the residual sum and the norm's values are the core norm kernel's bits
(``infer_core.layers.fused.norm_rows``), the K loop this GEMV's on the same tiles, at the norm kernel's warp count.
"""

from __future__ import annotations

import torch
import triton
from infer_core.layers.fused import use_pdl
from infer_core.layers.fused.gemv_tiles import LARGE_K, choose_config, num_sms
from infer_core.layers.fused.rms_norm import single_pass_tile

from infer_quant_w8a8.gemv_kernel import w8_gemv_kernel

MAX_ROWS = 8  # decode batches; more rows are a GEMM


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
    return _launch(x, weight, scale, bias, group_k, silu)


def w8_rms_norm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                     scale: torch.Tensor, bias: torch.Tensor | None = None, group_k: int | None = None,
                     residual: torch.Tensor | None = None, *, silu: bool = False,
                     residual_out: torch.Tensor | None = None, normed_out: torch.Tensor | None = None):
    """``w8_gemv(rms_norm(x, norm_weight, eps, residual), weight, scale, bias, group_k, silu)`` in one launch.

    Returns y, or ``(y, x + residual)`` with ``residual`` (like the core's ``rms_norm``): the sum is a new tensor,
    or ``residual_out`` (contiguous, x's shape and dtype) where given. ``normed_out`` (the same): also filled with
    the norm's output. The sum and the norm's output are the norm kernel's bits; y is ``w8_gemv``'s on that
    output up to the order of its float32 sums (the launch runs at the norm kernel's warp count).
    """
    if norm_weight.shape != (x.shape[-1],) or norm_weight.dtype != x.dtype:
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} {norm_weight.dtype} must be [{x.shape[-1]}] of "
                         f"x's dtype {x.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    for name, t in (("residual_out", residual_out), ("normed_out", normed_out)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or not t.is_contiguous()):
            raise ValueError(f"{name} {tuple(t.shape)} {t.dtype} must be contiguous, of x's shape {tuple(x.shape)} "
                             f"and dtype {x.dtype}")
    if residual is not None and residual_out is None:
        residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = _launch(x, weight, scale, bias, group_k, silu, (norm_weight, eps, residual, residual_out, normed_out))
    return y if residual is None else (y, residual_out)


def _launch(x, weight, scale, bias, group_k, silu, norm=None):
    """Checks, and the launch: the plain GEMV, or with ``norm`` ``(weight, eps, residual, residual_out,
    normed_out)`` the fused one. Returns y."""
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
    norm_weight, eps, residual, residual_out, normed_out = norm or (None, 0.0, None, None, None)
    if norm is not None and (n == 0 or k == 0):
        raise ValueError(f"the fused norm + GEMV needs K >= 1 and N >= 1, got weight {tuple(weight.shape)}")
    if num_rows == 0 or n == 0:
        return out
    groups = 1 if group_k is None else -(-k // group_k)
    if scale.shape[1] != groups:
        raise ValueError(f"scale {tuple(scale.shape)} must have {groups} columns for K={k} in groups of {group_k}")
    block_n, block_k, warps = tiles(n, k, group_k, x.device, silu)
    norm_block_m, norm_block_n = 1, 1
    if norm is not None:
        norm_block_m, norm_block_n, warps = single_pass_tile(k)  # the norm's sums need its kernel's thread layout
    res_rows = rows if residual is None else residual.reshape(-1, k)
    if res_rows.stride(-1) != 1:
        res_rows = res_rows.contiguous()
    pdl = use_pdl(rows)
    w8_gemv_kernel[(triton.cdiv(n_out, block_n),)](
        rows, res_rows, norm_weight if norm is not None else scale, weight, scale, bias if bias is not None else scale,
        out, residual_out if residual_out is not None else out, normed_out if normed_out is not None else out,
        num_rows, n_out, k, rows.stride(0), res_rows.stride(0), weight.stride(0), scale.stride(0), n_out, eps,
        GROUP_K=group_k or 0, BLOCK_M=triton.next_power_of_2(num_rows), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, HAS_BIAS=bias is not None, W_INT8=weight.dtype == torch.int8, SILU=silu,
        HAS_NORM=norm is not None, HAS_RESIDUAL=residual is not None, NORM_BLOCK_M=norm_block_m,
        NORM_BLOCK_N=norm_block_n, STORE_NORMED=normed_out is not None, USE_PDL=pdl,
        num_warps=warps, launch_pdl=pdl,
    )
    return out
