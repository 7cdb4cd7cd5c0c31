"""The experts of a mixture-of-experts layer as two grouped GEMMs: one launch for every expert's gate_up (with
SiLU-and-mul), one for every expert's down (with the routing weight), then the sum over each token's top-k.

The (token, k) entries arrive sorted by expert into blocks of ``BLOCK_M`` (``layers/moe/align.py``): a block
holds entries of one expert only, padded with the entry count ``num_entries`` (a row nobody reads or writes).
A program computes one ``BLOCK_M x BLOCK_N`` tile of one block: it reads the block's entry ids and expert,
gathers those rows of its input, multiplies them by that expert's weight tile, and scatters its rows to the
entries' places (entry ``t * top_k + k``). Every shape is fixed by the token count (the grid covers the most
blocks the entries can fill; programs past ``num_padded``, read on the device, return at once), so a CUDA
graph replays it for any routing.

8-bit weights (int8 or float8 e4m3, a quantizer's ``MoEMethod``) come with one float32 scale per weight row:
each tile is converted to the activations' dtype (exactly: int8's and e4m3's values all are bfloat16 / float16
values) and the float32 sums are multiplied by their columns' scales after the K loop, before anything else.

Numerics: products accumulate in float32 (``input_precision="ieee"`` for float32 inputs, so no TF32);
``silu(gate) * up`` is taken from the float32 sums and rounded once to the model dtype (the down GEMM's
input), the down sums are multiplied by the float32 routing weight and rounded once per entry, and the
top-k entries of a token are summed in float32, in k order, and rounded once (the combine launch). Over
expert-parallel ranks the entries of another rank's experts are neither computed nor read: the combine
skips them by their id, so no per-entry row is zero-filled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from infer_core.layers.fused import interpreting, use_pdl
from infer_core.layers.fused.pdl import pdl_enter

if TYPE_CHECKING:
    from infer_core.layers.moe.align import ExpertBlocks


@dataclass(frozen=True, slots=True)
class MoETiles:
    """Tile sizes of the grouped GEMMs; ``block_m`` is also the alignment of each expert's group of entries."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def choose_tiles(num_entries: int, num_experts: int) -> MoETiles:
    """The tiles for ``num_entries`` (token, k) entries routed over the model's ``num_experts`` (all of them, on an
    expert-parallel rank too), chosen by the entries an expert gets: up to 10, 16-row blocks with 128-deep K steps
    (decode: the weights' bytes bound it, and many programs stream them); up to 24, 32-row blocks; up to 128,
    64 x 64 tiles; more (prefill: the tensor cores bound it), 64 x 128 tiles on 8 warps. Where a rank is handed
    every entry of the step (the all-reduce dispatch) its experts get what one GPU's do, so it takes one GPU's
    tiles; handed only the rows sent to it (all-to-all), it counts fewer. The thresholds come from a sweep at
    Qwen3-30B-A3B's shapes (all 128 experts, and a rank's 64)."""
    per_expert = num_entries / num_experts
    if per_expert <= 10:
        return MoETiles(16, 64, 128, 1, 4, 3)
    if per_expert <= 24:
        return MoETiles(32, 64, 128, 4, 4, 3)
    if per_expert <= 128:
        return MoETiles(64, 64, 64, 8, 4, 3)
    return MoETiles(64, 128, 64, 8, 8, 3)


@triton.jit
def _dot(a, w, acc, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ w`` in float32."""
    if UPCAST:  # the interpreter's dot reads bfloat16 operands as raw bits: multiply in float32
        return tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, w, acc, input_precision=DOT_PRECISION)


@triton.jit
def _weight_tile(ptrs, mask, a, W_SCALED: tl.constexpr, UPCAST: tl.constexpr):
    """A weight tile, zero where masked; 8-bit weights converted to ``a``'s dtype (float32 in the interpreter),
    their masked lanes zeroed after the conversion rather than by a float ``other`` on the 8-bit load, as the W8
    GEMV does."""
    if not W_SCALED:
        return tl.load(ptrs, mask=mask, other=0.0)
    w = tl.load(ptrs, mask=mask)
    if UPCAST:
        w = w.to(tl.float32)
    else:
        w = w.to(a.dtype)
    return tl.where(mask, w, 0.0)


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, topk_weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, w_scale_ptr,
    n, k, num_entries, num_slots,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn, up_rows, stride_se,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr, W_SCALED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr, USE_PDL: tl.constexpr,
):
    """``c[e] = act(a[e // A_ROW_DIV] @ W[expert(e)]^T) (x weight[e])`` for the entries ``e`` of one block tile.

    GATED: ``W[expert]`` holds the gate rows, then ``up_rows`` rows on the up rows; the tile is
    ``silu(gate) * up`` of its ``BLOCK_N`` columns. WEIGHTED: rows are multiplied by ``topk_weights[e]``.
    W_SCALED: W is 8-bit, ``w_scale[expert, row]`` its rows' scales.
    """
    pdl_enter(USE_PDL)  # before any load or store: see fused/pdl.py
    pid = tl.program_id(0)
    num_pid_m = num_slots // BLOCK_M
    num_pid_n = tl.cdiv(n, BLOCK_N)
    # groups of GROUP_M row blocks sweep the columns together, so their weight tiles are read from L2
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    entries = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = entries < num_entries
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = (entries // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(k, BLOCK_K)):
        mask_k = offs_k < k - step * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
        mask_w = mask_k[:, None] & mask_n[None, :]
        acc = _dot(a, _weight_tile(w_ptrs, mask_w, a, W_SCALED, UPCAST), acc, DOT_PRECISION, UPCAST)
        if GATED:
            w_up = _weight_tile(w_ptrs + up_rows * stride_wn, mask_w, a, W_SCALED, UPCAST)
            acc_up = _dot(a, w_up, acc_up, DOT_PRECISION, UPCAST)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    if W_SCALED:
        scales = w_scale_ptr + expert * stride_se + offs_n
        acc = acc * tl.load(scales, mask=mask_n, other=0.0)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(scales + up_rows, mask=mask_n, other=0.0)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(topk_weights_ptr + entries, mask=valid, other=0.0)[:, None]
    c_ptrs = c_ptr + entries[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


@triton.jit
def _combine_kernel(per_entry_ptr, ids_ptr, out_ptr, n, num_local, stride_e, stride_o,
                    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, DROPS: tl.constexpr, USE_PDL: tl.constexpr):
    """``out[t] = sum_k per_entry[t * TOP_K + k]`` over ``BLOCK_N`` columns, in float32, rounded once; with DROPS,
    an entry whose expert id is ``num_local`` or more (another rank's) is not read."""
    pdl_enter(USE_PDL)
    token = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < n
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        entry = token * TOP_K + k
        end = n
        if DROPS:  # another rank's entry: no column is read
            end = tl.where(tl.load(ids_ptr + entry) < num_local, n, 0)
        row = per_entry_ptr + entry.to(tl.int64) * stride_e
        acc += tl.load(row + offs, mask=offs < end, other=0.0).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * stride_o + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def combine_entries(per_entry: torch.Tensor, top_k: int, local_ids: torch.Tensor | None = None,
                    num_local: int = 0) -> torch.Tensor:
    """Each token's ``top_k`` rows of ``per_entry`` [tokens x top_k, n] summed (float32, rounded once) into
    [tokens, n]; with ``local_ids`` [tokens, top_k], the rows whose id is ``num_local`` or more are left out."""
    rows, n = per_entry.shape
    if rows % top_k or per_entry.stride(1) != 1:
        raise ValueError(f"per_entry {tuple(per_entry.shape)} (strides {per_entry.stride()}) is not [tokens x "
                         f"{top_k}, n] with contiguous rows")
    if local_ids is not None and (local_ids.numel() != rows or num_local < 1):
        raise ValueError(f"local_ids has {local_ids.numel()} ids for {rows} entries and num_local={num_local}: "
                         "give one id an entry and the rank's expert count")
    num_tokens = rows // top_k
    out = torch.empty((num_tokens, n), dtype=per_entry.dtype, device=per_entry.device)
    if num_tokens == 0:
        return out
    block_n = min(1024, triton.next_power_of_2(n))
    drops = local_ids is not None
    ids = local_ids.reshape(-1) if drops else per_entry  # unread without DROPS
    pdl = use_pdl(per_entry)
    _combine_kernel[(num_tokens, triton.cdiv(n, block_n))](
        per_entry, ids, out, n, num_local, per_entry.stride(0), out.stride(0),
        TOP_K=top_k, BLOCK_N=block_n, DROPS=drops, USE_PDL=pdl, launch_pdl=pdl, num_warps=4,
    )
    return out


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor | None, out: torch.Tensor,
                  topk_weights: torch.Tensor, blocks: ExpertBlocks, tiles: MoETiles, *, a_row_div: int, gated: bool,
                  weighted: bool) -> None:
    n = w.shape[1] // 2 if gated else w.shape[1]
    k = w.shape[2]
    num_slots = blocks.sorted_ids.numel()
    grid = (num_slots // tiles.block_m * triton.cdiv(n, tiles.block_n),)
    pdl = use_pdl(a)
    scaled = w_scale is not None
    _moe_gemm_kernel[grid](
        a, w, out, topk_weights, blocks.sorted_ids, blocks.expert_ids, blocks.num_padded, w_scale if scaled else w,
        n, k, out.shape[0], num_slots,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1), n,
        w_scale.stride(0) if scaled else 0,
        A_ROW_DIV=a_row_div, GATED=gated, WEIGHTED=weighted, W_SCALED=scaled,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        UPCAST=interpreting(), USE_PDL=pdl, launch_pdl=pdl, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def scaled_weights(gate_up: torch.Tensor, down: torch.Tensor, gate_up_scale: torch.Tensor | None,
                   down_scale: torch.Tensor | None) -> bool:
    """Whether the experts are 8-bit with their rows' scales (both given, float32 [E, 2I] and [E, H], contiguous
    rows), or in a float dtype without scales; anything else is an error naming what was given."""
    scaled = (gate_up_scale is not None, down_scale is not None)
    if scaled[0] != scaled[1] or (gate_up.element_size() == 1) != scaled[0]:
        raise ValueError(f"8-bit expert weights need both scales, and only they: gate_up {gate_up.dtype}, down "
                         f"{down.dtype}, scales given {scaled}")
    if scaled[0] and (gate_up_scale.shape != gate_up.shape[:2] or down_scale.shape != down.shape[:2]
                      or gate_up_scale.dtype != torch.float32 or down_scale.dtype != torch.float32
                      or gate_up_scale.stride(1) != 1 or down_scale.stride(1) != 1):
        raise ValueError(f"scales {tuple(gate_up_scale.shape)} {gate_up_scale.dtype}, {tuple(down_scale.shape)} "
                         f"{down_scale.dtype} must be float32 [E, 2I] {tuple(gate_up.shape[:2])} and [E, H] "
                         f"{tuple(down.shape[:2])}, one a weight row, contiguous rows")
    return scaled[0]


def fused_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                  blocks: ExpertBlocks, tiles: MoETiles, *, local_ids: torch.Tensor | None = None,
                  gate_up_scale: torch.Tensor | None = None, down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with ``e = topk_ids[t, k]``.

    ``x`` [T, H]; ``gate_up`` [E, 2I, H] (gate rows, then up rows); ``down`` [E, H, I]; ``topk_weights``
    [T, top_k] float32; ``blocks`` the entries sorted by expert in blocks of ``tiles.block_m`` (an
    ``ExpertBlocks``). ``local_ids`` [T, top_k]: given where some entries are other ranks' experts (id ``E``,
    left out of ``blocks``), which count as zero. ``gate_up_scale`` [E, 2I] and ``down_scale`` [E, H], float32:
    given with 8-bit weights (int8 or float8 e4m3), each weight row's scale (``W ~= q * scale``).
    """
    num_tokens, top_k = topk_weights.shape
    num_entries = num_tokens * top_k
    if blocks.block_m != tiles.block_m:
        raise ValueError(f"the entries are grouped in blocks of {blocks.block_m}, the tiles are {tiles.block_m} rows: "
                         "align them with tiles.block_m")
    if x.shape[1] != gate_up.shape[2] or down.shape[2] * 2 != gate_up.shape[1]:
        raise ValueError(f"x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} do not fit: "
                         "gate_up must be [E, 2I, H] and down [E, H, I] for x [T, H]")
    scaled_weights(gate_up, down, gate_up_scale, down_scale)
    inter = torch.empty((num_entries, gate_up.shape[1] // 2), dtype=x.dtype, device=x.device)
    per_entry = torch.empty((num_entries, down.shape[1]), dtype=x.dtype, device=x.device)
    if num_entries:
        weights = topk_weights.reshape(-1)
        _grouped_gemm(x, gate_up, gate_up_scale, inter, weights, blocks, tiles, a_row_div=top_k, gated=True,
                      weighted=False)
        _grouped_gemm(inter, down, down_scale, per_entry, weights, blocks, tiles, a_row_div=1, gated=False,
                      weighted=True)
    return combine_entries(per_entry, top_k, local_ids, gate_up.shape[0])
